"""The serving process's tokenizer and grammar compiler, built while its engine process loads.

Once the engine process reported ready, `ServedModel.from_runtime` parsed the model's tokenizer and
built the grammar compiler's token table (llguidance's, over the whole vocabulary): about 1.3 s for
a 129k vocabulary on a 2-core machine, on the start's critical path, after the serving process had
waited idle through the load. `FrontendAhead` builds both on a thread of its own from the verified
core's tokenizer resource, started once the engine process is ordered to load
(`start_engine_process(..., while_loading=...)`: not before, as llguidance's build holds the
interpreter lock for most of a second). `from_runtime` takes them where they were built from what
it would build them from (the tokenizer bytes the engine process reports, the sampled vocabulary,
the end-of-sequence ids), else builds its own, as it does where the build failed.
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence

from tokenizers import Tokenizer

from helios.frontend.structured.grammar import GrammarCompiler
from helios.server.start_trace import mark


class FrontendAhead:
    """A tokenizer and grammar compiler being built on a thread from `read_tokenizer()`'s bytes."""

    def __init__(self, read_tokenizer: Callable[[], bytes], vocab_size: int, eos_token_ids: Sequence[int]):
        self._read_tokenizer = read_tokenizer
        self._key: tuple | None = None
        self._parts: tuple[Tokenizer, GrammarCompiler] | None = None
        self._vocab_size = vocab_size
        self._eos_token_ids = tuple(eos_token_ids)
        self.failure: Exception | None = None  # what the build raised, if it failed
        self._thread = threading.Thread(target=self._build, name="helios-frontend-ahead", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _build(self) -> None:
        try:
            text = self._read_tokenizer()
            tokenizer = Tokenizer.from_str(text.decode("utf-8"))
            grammar = GrammarCompiler.from_tokenizer(tokenizer, vocab_size=self._vocab_size,
                                                     eos_token_ids=self._eos_token_ids)
        except Exception as error:  # noqa: BLE001 - `from_runtime` builds them again and reports its own error
            self.failure = error
            return
        self._key = (text, self._vocab_size, self._eos_token_ids)
        self._parts = (tokenizer, grammar)
        mark("tokenizer and grammar compiler built")

    def parts_for(self, tokenizer_json: bytes, vocab_size: int,
                  eos_token_ids: Sequence[int]) -> tuple[Tokenizer, GrammarCompiler] | None:
        """The (tokenizer, grammar compiler) built from these, once the build ended; None where it
        was built from others, failed, or never started."""
        if self._thread.ident is None:  # never started
            return None
        self._thread.join()
        if self._key != (tokenizer_json, vocab_size, tuple(eos_token_ids)):
            return None
        return self._parts
