"""The engine process's grammar compiler, built on a thread once the process has reported ready.

The engine process compiles each structured-output request's grammar again from its source
(`helios.runtime.engine_link.serve_link`), against a compiler built from the loaded model's
tokenizer: llguidance's token table over the whole vocabulary, about 1.3 s for a 129k vocabulary on
a 2-core machine. Built before the ready record, it held back the start of every request. Now
`EngineGrammars` starts that build once the ready record is sent; a request with a grammar that
arrives before the build ends waits for it on the compile thread (the serving process has built and
checked its own compiler from the same tokenizer, `helios.server.frontend_ahead`), and one that
arrives after a failed build fails alone, naming why.

`compile_later(source)` returns at once with a `Future` of the matcher: the wait for the build and the
compile run on one thread of their own, in the order asked, so the command loop goes on taking other
requests and cancellations meanwhile (`serve_link` holds the request until its compile ends; a 64 KiB
schema of 3,000 required properties compiles in about 1.4 s on a 2-core machine, and the command loop
waited for it: every other client's requests and cancellations queued behind it). That thread has the
preparation threads' large stack (`helios.server.preparation.STACK_NBYTES`), not the command loop's:
llguidance compiles recursively in native code, and a grammar deep enough to overflow the main
thread's 8 MiB (one the serving process's preparation, on its large stack, had compiled) killed the
engine process, and the server with it, with a segfault. `close` drops the compiles not yet begun.

A response's ``n`` choices are ``n`` admissions of one source, one after another: the first compiles
it and each choice gets a fork of that compile (`GrammarMatcher.fork`; the choices after it compile
nothing: a 64 KiB schema compiles in about 150 ms on a 320-token vocabulary here, where a fork takes
microseconds, so 16 choices cost about one compile rather than 16). llguidance cannot share a compiled
grammar without its lexer (its Python API builds a matcher only from grammar text, and `deep_copy`
shares the lexer, its states, their limit and its sticky error), so the forks share the lexer: a fork
that meets a limit after another's work is built again from the source before it reports one
(`GrammarMatcher`), and meets only its own. One compile serves at most `FORKS_PER_COMPILE` forks in a row
(a response's choices), so requests that send the same source one after another do not all share one
lexer for good.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Sequence

from helios.errors import ExecutionError
from helios.server.frontend_ahead import FrontendAhead
from helios.server.preparation import STACK_NBYTES

# Forks one compile gives before the next admission of its source compiles again: a response's choices
# (`helios.server.schemas.MAX_CHOICES`, not imported: the engine process never loads the request schemas).
FORKS_PER_COMPILE = 16

if TYPE_CHECKING:
    from helios.frontend.structured.grammar import GrammarMatcher
    from helios.runtime.feedback import GrammarState  # imports torch: loaded by then in the engine process


class GrammarCompilerUnavailableError(ExecutionError):
    """The engine process's grammar compiler could not be built (the request with a grammar fails)."""


class EngineGrammars:
    """`compile_later(source)`: a grammar matcher from the compiler built on a thread (`FrontendAhead`,
    the serving process's build) from `tokenizer_json` for the sampled vocabulary `vocab_size` and the
    end-of-sequence ids `eos_token_ids`, started by `start` with the compile thread. `compile_later`
    and `close` are called from one thread (the command loop)."""

    def __init__(self, tokenizer_json: bytes, vocab_size: int, eos_token_ids: Sequence[int]):
        self._of = (tokenizer_json, vocab_size, tuple(eos_token_ids))
        self._build = FrontendAhead(lambda: tokenizer_json, vocab_size, eos_token_ids)
        self._compiles: ThreadPoolExecutor | None = None  # one thread with a large stack, made by `start`
        # On the compile thread: the last source compiled, its untouched matcher, and the forks it may still give.
        self._last: tuple[str, GrammarMatcher, int] | None = None

    def start(self) -> "EngineGrammars":
        self._build.start()
        self._compiles = _large_stack_thread()
        return self

    def compile_later(self, source: str) -> Future[GrammarState]:
        """The `TensorGrammar` of `source`, compiled on the compile thread once the compiler is built
        (never waiting here); its exception is the compile's error (`GrammarError`), or
        `GrammarCompilerUnavailableError` where the build failed or was never started."""
        if self._compiles is None:
            never: Future[GrammarState] = Future()
            never.set_exception(GrammarCompilerUnavailableError(
                "the engine process's grammar compiler build was never started"))
            return never
        return self._compiles.submit(self._compile, source)

    def compile(self, source: str) -> GrammarState:
        """`compile_later(source)`'s matcher, waited for here."""
        return self.compile_later(source).result()

    def close(self) -> None:
        """Cancels the compiles not yet begun (their futures end cancelled); the one running ends on its
        own (llguidance's limits bound it), so the process exits after it at the latest."""
        if self._compiles is not None:
            self._compiles.shutdown(wait=False, cancel_futures=True)

    def _compile(self, source: str) -> GrammarState:
        """On the compile thread: waits for the build, then compiles."""
        from helios.runtime.feedback import TensorGrammar

        parts = self._build.parts_for(*self._of)
        if parts is None:
            error = self._build.failure
            raise GrammarCompilerUnavailableError(
                "the engine process's grammar compiler build was never started" if error is None else
                f"the engine process could not build its grammar compiler: {type(error).__name__}: {error}")
        if self._last is None or self._last[0] != source or self._last[2] == 0:
            self._last = (source, parts[1].compile_source(source), FORKS_PER_COMPILE)
        _, compiled, forks_left = self._last
        self._last = (source, compiled, forks_left - 1)
        return TensorGrammar(compiled.fork())


def _large_stack_thread() -> ThreadPoolExecutor:
    """An executor whose one thread, started here, has a `STACK_NBYTES` stack."""
    previous = threading.stack_size(STACK_NBYTES)
    try:
        executor = ThreadPoolExecutor(1, thread_name_prefix="helios-engine-grammar")
        executor.submit(int).result()  # its thread starts now, with this stack size
    finally:
        threading.stack_size(previous)
    return executor
