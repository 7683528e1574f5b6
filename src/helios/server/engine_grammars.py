"""The engine process's grammar compiler, built on a thread once the process has reported ready.

The engine process compiles each structured-output request's grammar again from its source
(`helios.runtime.engine_link.serve_link`), against a compiler built from the loaded model's
tokenizer: llguidance's token table over the whole vocabulary, about 1.3 s for a 129k vocabulary on
a 2-core machine. Built before the ready record, it held back the start of every request. Now
`EngineGrammars` starts that build once the ready record is sent; a request with a grammar that
arrives before the build ends waits for it on the command loop (the serving process has built and
checked its own compiler from the same tokenizer, `helios.server.frontend_ahead`), and one that
arrives after a failed build fails alone, naming why.

Each compile runs on a thread of its own with the preparation threads' large stack
(`helios.server.preparation.STACK_NBYTES`), not on the command loop's: llguidance compiles
recursively in native code, and a grammar deep enough to overflow the main thread's 8 MiB (one the
serving process's preparation, on its large stack, had compiled) killed the engine process, and
the server with it, with a segfault.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from helios.errors import ExecutionError
from helios.server.frontend_ahead import FrontendAhead
from helios.server.preparation import STACK_NBYTES


class GrammarCompilerUnavailableError(ExecutionError):
    """The engine process's grammar compiler could not be built (the request with a grammar fails)."""


class EngineGrammars:
    """`compile(source)`: a grammar matcher from the compiler built on a thread (`FrontendAhead`, the
    serving process's build) from `tokenizer_json` for the sampled vocabulary `vocab_size` and the
    end-of-sequence ids `eos_token_ids`, started by `start`."""

    def __init__(self, tokenizer_json: bytes, vocab_size: int, eos_token_ids: Sequence[int]):
        self._of = (tokenizer_json, vocab_size, tuple(eos_token_ids))
        self._build = FrontendAhead(lambda: tokenizer_json, vocab_size, eos_token_ids)
        self._compiles: ThreadPoolExecutor | None = None  # one thread with a large stack, made by the first compile

    def start(self) -> "EngineGrammars":
        self._build.start()
        return self

    def compile(self, source: str):
        """The `TensorGrammar` of `source`, once the compiler is built (waiting for it here)."""
        from helios.runtime.feedback import TensorGrammar

        parts = self._build.parts_for(*self._of)
        if parts is None:
            error = self._build.failure
            raise GrammarCompilerUnavailableError(
                "the engine process's grammar compiler build was never started" if error is None else
                f"the engine process could not build its grammar compiler: {type(error).__name__}: {error}")
        if self._compiles is None:
            self._compiles = _large_stack_thread()
        return TensorGrammar(self._compiles.submit(parts[1].compile_source, source).result())


def _large_stack_thread() -> ThreadPoolExecutor:
    """An executor whose one thread, started here, has a `STACK_NBYTES` stack."""
    previous = threading.stack_size(STACK_NBYTES)
    try:
        executor = ThreadPoolExecutor(1, thread_name_prefix="helios-engine-grammar")
        executor.submit(int).result()  # its thread starts now, with this stack size
    finally:
        threading.stack_size(previous)
    return executor
