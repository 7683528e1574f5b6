"""The engine process's grammar compiler, built on a thread once the process has reported ready.

The engine process compiles each structured-output request's grammar again from its source
(`helios.runtime.engine_link.serve_link`), against a compiler built from the loaded model's
tokenizer: llguidance's token table over the whole vocabulary, about 1.3 s for a 129k vocabulary on
a 2-core machine. Built before the ready record, it held back the start of every request. Now
`EngineGrammars` starts that build once the ready record is sent; a request with a grammar that
arrives before the build ends waits for it on the command loop (the serving process has built and
checked its own compiler from the same tokenizer, `helios.server.frontend_ahead`), and one that
arrives after a failed build fails alone, naming why.
"""

from __future__ import annotations

import threading
from typing import Sequence

from helios.errors import ExecutionError


class GrammarCompilerUnavailableError(ExecutionError):
    """The engine process's grammar compiler could not be built (the request with a grammar fails)."""


class EngineGrammars:
    """`compile(source)`: a grammar matcher from the compiler built on a thread from `tokenizer_json`
    (the sampled vocabulary `vocab_size`, end-of-sequence ids `eos_token_ids`), started by `start`."""

    def __init__(self, tokenizer_json: bytes, vocab_size: int, eos_token_ids: Sequence[int]):
        self._arguments = (tokenizer_json, vocab_size, tuple(eos_token_ids))
        self._built = threading.Event()
        self._compiler = None
        self._error: Exception | None = None
        self._thread = threading.Thread(target=self._build, name="helios-engine-grammars", daemon=True)

    def start(self) -> "EngineGrammars":
        self._thread.start()
        return self

    def _build(self) -> None:
        from tokenizers import Tokenizer

        from helios.frontend.structured.grammar import GrammarCompiler

        tokenizer_json, vocab_size, eos_token_ids = self._arguments
        try:
            tokenizer = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
            self._compiler = GrammarCompiler.from_tokenizer(tokenizer, vocab_size=vocab_size,
                                                            eos_token_ids=eos_token_ids)
        except Exception as error:  # noqa: BLE001 - each request with a grammar reports it
            self._error = error
        finally:
            self._built.set()

    def compile(self, source: str):
        """The `TensorGrammar` of `source`, once the compiler is built (waiting for it here)."""
        from helios.runtime.feedback import TensorGrammar

        if self._thread.ident is None:
            raise GrammarCompilerUnavailableError("the engine process's grammar compiler build was never started")
        self._built.wait()
        if self._compiler is None:
            error = self._error
            raise GrammarCompilerUnavailableError(
                f"the engine process could not build its grammar compiler: {type(error).__name__}: {error}")
        return TensorGrammar(self._compiler.compile_source(source))
