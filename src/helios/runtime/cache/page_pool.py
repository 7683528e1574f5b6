"""Shared page pool: the allocator composed with the prefix cache.

Every holder of a page id (a request's page table, a snapshot, a copy awaiting its fence) owns
one reference. When the last reference goes, a cached page is parked (evictable, reusable by a
prefix hit) and an uncached page becomes free. Allocation takes free pages first and then
evicts parked pages in LRU order; it returns the pages or None and never half-allocates.
"""

from __future__ import annotations

from typing import Sequence

from helios.runtime.cache.pages import PageAllocator
from helios.runtime.cache.prefix_cache import PrefixCache


class PagePool:
    """Pages of every paged history region, shared by requests and snapshots."""

    def __init__(self, allocator: PageAllocator, cache: PrefixCache):
        self.allocator = allocator
        self.cache = cache
        self.num_evicted = 0

    @property
    def num_pages(self) -> int:
        return self.allocator.num_pages

    @property
    def num_available(self) -> int:
        """Pages an allocation could obtain now: free plus parked."""
        return self.allocator.num_free + self.cache.num_parked

    def allocate(self, count: int, follow: int | None = None) -> list[int] | None:
        """`count` private pages (one reference each), evicting LRU parked pages if needed; or None.
        Consecutive ids where a run is free, the ids after page `follow` first (`PageAllocator`)."""
        shortfall = count - self.allocator.num_free
        if shortfall > 0:
            evicted = self.cache.evict(shortfall)
            if evicted is None:
                return None
            self.allocator.free(evicted)
            self.num_evicted += shortfall
        return self.allocator.allocate(count, follow)

    def retain(self, pages: Sequence[int]) -> None:
        """One more reference to each page (reviving parked pages)."""
        for page in pages:
            self.cache.unpark(page)
        self.allocator.retain(list(pages))

    def release(self, pages: Sequence[int]) -> None:
        """Drop one reference per page. Pages parked in the given order: pass tails first so that
        the ends of chains are evicted before their prefixes."""
        for page in self.allocator.release(list(pages)):
            if self.cache.is_cached(page):
                self.cache.park(page)
            else:
                self.allocator.free([page])

    def share(self, digests: Sequence[bytes]) -> list[int]:
        """Retain and return the cached pages of the longest cached run of leading digests."""
        pages = self.cache.lookup(digests)
        self.retain(pages)
        return pages

    def publish(self, digest: bytes, page: int) -> bool:
        """Make a complete, referenced page findable under its chain digest."""
        return self.cache.insert(digest, page)
