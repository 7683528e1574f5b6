"""Physical page ids and their reference counts.

`PageAllocator` owns the count of holders of every page id and the list of free ids. It knows
nothing of prefix caching: `release` reports the pages whose count reached zero and the caller
(`PagePool`) decides whether each becomes free or stays cached. One page id spans every paged
history region of the storage layout, so one allocator serves all of them.

Invariant: a page is free exactly when it is in the free list; a free page has count zero.
A page with count zero that is not free is owned by the caller (parked in a cache).
"""

from __future__ import annotations

from collections import deque

from helios.runtime.records.faults import PageAccountingError


class PageAllocator:
    """Reference counts for `num_pages` page ids; allocation is all-or-nothing."""

    def __init__(self, num_pages: int):
        self.num_pages = num_pages
        self._refs = [0] * num_pages
        self._free: deque[int] = deque(range(num_pages))
        self._is_free = [True] * num_pages

    @property
    def num_free(self) -> int:
        return len(self._free)

    def ref_count(self, page: int) -> int:
        return self._refs[page]

    def is_free(self, page: int) -> bool:
        return self._is_free[page]

    def allocate(self, count: int) -> list[int] | None:
        """Take `count` free pages, each with one reference, or None (and change nothing)."""
        if count > len(self._free):
            return None
        pages = [self._free.popleft() for _ in range(count)]
        for page in pages:
            self._is_free[page] = False
            self._refs[page] = 1
        return pages

    def retain(self, pages: list[int]) -> None:
        """Add one reference to each page; a page at zero must be parked by the caller, not free."""
        for page in pages:
            if self._is_free[page]:
                raise PageAccountingError(f"page {page} is free and cannot be retained")
            self._refs[page] += 1

    def release(self, pages: list[int]) -> list[int]:
        """Drop one reference from each page; returns the pages whose count reached zero, in order."""
        unreferenced = []
        for page in pages:
            if self._refs[page] <= 0:
                raise PageAccountingError(f"page {page} released without a reference")
            self._refs[page] -= 1
            if self._refs[page] == 0:
                unreferenced.append(page)
        return unreferenced

    def free(self, pages: list[int]) -> None:
        """Return unreferenced, non-free pages to the free list (appended: reused last)."""
        for page in pages:
            if self._refs[page] != 0 or self._is_free[page]:
                raise PageAccountingError(f"page {page} cannot be freed (refs {self._refs[page]})")
            self._is_free[page] = True
            self._free.append(page)

    def free_pages(self) -> list[int]:
        return list(self._free)
