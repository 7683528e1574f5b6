"""Prefix reuse over complete pages: chained page digests and an LRU of unreferenced cached pages.

The digest of page i covers the digest of page i - 1 (the root digest for page 0), the page's
token ids and, through the root, the cache identity and the request's cache salt. Equal digests
therefore mean equal token prefixes under the same identity; only complete pages are digested,
so a cached page is immutable.

`PrefixCache` maps digests to page ids and keeps the cached pages that no one references in LRU
order (oldest first). It never changes reference counts: `PagePool` composes it with the
allocator. Invariant: every parked page is cached; index and reverse index are inverse maps.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from typing import Sequence

from helios.runtime.records.faults import require

DIGEST_BYTES = 16


def root_digest(identity: bytes, salt: bytes = b"") -> bytes:
    """Digest that starts every chain: the model's cache identity plus a request's cache salt."""
    hasher = hashlib.blake2b(digest_size=DIGEST_BYTES, person=b"helios-root")
    hasher.update(len(identity).to_bytes(4, "little"))
    hasher.update(identity)
    hasher.update(salt)
    return hasher.digest()


# A page digest's hasher before any data: copied per page (cheaper than building one with its
# parameters; the same digests).
_PAGE_HASHER = hashlib.blake2b(digest_size=DIGEST_BYTES, person=b"helios-page")


def page_digest(parent: bytes, token_ids: Sequence[int]) -> bytes:
    """Digest of one complete page chained to its parent's digest."""
    hasher = _PAGE_HASHER.copy()
    hasher.update(parent)
    hasher.update(array("q", token_ids).tobytes())
    return hasher.digest()


def extend_chain(chain: list[bytes], root: bytes, token_ids: Sequence[int], page_tokens: int,
                 num_pages: int, until_missing: PrefixCache | None = None) -> None:
    """Append digests to `chain` until it covers `num_pages` complete pages of `token_ids`: each
    `page_digest` of its page, the pages' ids packed once. With `until_missing`, stop after the
    first new digest that cache does not hold: a lookup of the chain reads no further (a cold
    prompt's admission then digests one page, not its 128)."""
    first = len(chain)
    if first >= num_pages:
        return
    ids = array("q", token_ids[first * page_tokens:num_pages * page_tokens])
    packed, step = memoryview(ids).cast("B"), page_tokens * ids.itemsize
    parent = chain[-1] if chain else root
    copy = _PAGE_HASHER.copy
    for offset in range(0, (num_pages - first) * step, step):
        hasher = copy()
        hasher.update(parent)
        hasher.update(packed[offset:offset + step])
        parent = hasher.digest()
        chain.append(parent)
        if until_missing is not None and parent not in until_missing._pages:
            return


class PrefixCache:
    """Digest -> page index plus the LRU of parked (cached, unreferenced) pages."""

    def __init__(self) -> None:
        self._pages: dict[bytes, int] = {}
        self._digests: dict[int, bytes] = {}
        self._parked: OrderedDict[int, None] = OrderedDict()

    @property
    def num_cached(self) -> int:
        return len(self._pages)

    @property
    def num_parked(self) -> int:
        return len(self._parked)

    def is_cached(self, page: int) -> bool:
        return page in self._digests

    def is_parked(self, page: int) -> bool:
        return page in self._parked

    def digest_of(self, page: int) -> bytes | None:
        return self._digests.get(page)

    def lookup(self, digests: Sequence[bytes]) -> list[int]:
        """Pages of the longest run of leading digests that are cached. Changes nothing."""
        pages = []
        for digest in digests:
            page = self._pages.get(digest)
            if page is None:
                break
            pages.append(page)
        return pages

    def insert(self, digest: bytes, page: int) -> bool:
        """Cache `page` under `digest`; False (no change) when the digest or the page is taken."""
        if digest in self._pages or page in self._digests:
            return False
        self._pages[digest] = page
        self._digests[page] = digest
        return True

    def park(self, page: int) -> None:
        """A cached page lost its last holder: most recently used, evicted last."""
        self._parked[page] = None

    def unpark(self, page: int) -> bool:
        """A parked page gained a holder; True when it was parked."""
        return self._parked.pop(page, 0) is None

    def evict(self, count: int) -> list[int] | None:
        """Forget the `count` least recently used parked pages and return them, or None."""
        if count > len(self._parked):
            return None
        evicted = []
        for _ in range(count):
            page, _ = self._parked.popitem(last=False)
            del self._pages[self._digests.pop(page)]
            evicted.append(page)
        return evicted

    def parked_pages(self) -> list[int]:
        """Parked pages, least recently used first."""
        return list(self._parked)

    def check(self) -> None:
        """Raise `InvariantViolation` when the index, reverse index or LRU disagree."""
        require(len(self._pages) == len(self._digests), "digest index and page index differ in size")
        for digest, page in self._pages.items():
            require(self._digests.get(page) == digest, f"page {page} index mismatch")
        for page in self._parked:
            require(page in self._digests, f"parked page {page} is not cached")
