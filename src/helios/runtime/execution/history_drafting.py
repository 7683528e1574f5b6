"""History drafting: proposal candidates copied from a request's own token history.

`HistoryIndex` holds one request's tokens (prompt, then every validated emission) and, for each
n-gram size in `NGRAM_SIZES`, where the token after that n-gram's latest earlier occurrence sits.
`candidates(limit)` finds the longest suffix of the history seen before and copies up to `limit`
tokens that followed it there (prompt-lookup drafting). The SPECULATIVE program verifies the
candidates like any proposal, so a wrong candidate costs a rejected position and never changes
output.

Cost: O(len(NGRAM_SIZES)) dictionary updates per appended token and lookups per round.
Ownership: the packer keeps one index per request in the model worker thread; not thread-safe.
"""

from __future__ import annotations

from typing import Iterable

NGRAM_SIZES = (4, 3, 2)  # longest first: a longer shared suffix is a better predictor


class HistoryIndex:
    def __init__(self, tokens: Iterable[int] = ()):
        self.tokens: list[int] = []
        self._follows: dict[tuple[int, ...], int] = {}  # n-gram -> index of the token after it
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            index = len(self.tokens)
            for size in NGRAM_SIZES:
                if index >= size:
                    self._follows[tuple(self.tokens[index - size:index])] = index
            self.tokens.append(token)

    def candidates(self, limit: int) -> tuple[int, ...]:
        """`limit` tokens copied from after the latest earlier occurrence of the longest suffix.

        The copy may overlap its own output (as in LZ77): a match `period` tokens back continues
        the history's repetition with that period.
        """
        if limit <= 0:
            return ()
        for size in NGRAM_SIZES:
            if len(self.tokens) < size:
                continue
            start = self._follows.get(tuple(self.tokens[-size:]))
            if start is not None:
                copied = self.tokens[start:start + limit]
                period = len(self.tokens) - start
                while len(copied) < limit:
                    copied.append(copied[len(copied) - period])
                return tuple(copied)
        return ()
