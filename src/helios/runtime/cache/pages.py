"""Physical page ids and their reference counts.

`PageAllocator` owns the count of holders of every page id and which ids are free. It knows
nothing of prefix caching: `release` reports the pages whose count reached zero and the caller
(`PagePool`) decides whether each becomes free or stays cached. One page id spans every paged
history region of the storage layout, so one allocator serves all of them.

Placement: an allocation of several pages takes a run of consecutive free ids whenever one exists,
so a cold prompt's keys and values sit in one contiguous stretch of every cache region (the
prefill kernel then reads whole key/value tiles through tensor descriptors instead of gathering
them page by page: `helios.abi.triton_prefill_steps`). The search is next-fit: it starts where the
previous allocation ended and wraps around, so freed ids are reused late, after the ids ahead of
them. `follow` asks for the ids right after a given page first (a prompt's next chunk, a row's
next page continue its run). When no run is free, the first free ids from the same start are
taken (ascending): fragmentation only costs the descriptor path, never an allocation.

Invariant: a page is free exactly when its byte in the free map is set; a free page has count
zero. A page with count zero that is not free is owned by the caller (parked in a cache).
"""

from __future__ import annotations

from helios.runtime.records.faults import PageAccountingError

_FREE, _TAKEN = 1, 0
_FREE_BYTE, _TAKEN_BYTE = bytes([_FREE]), bytes([_TAKEN])


class PageAllocator:
    """Reference counts for `num_pages` page ids; allocation is all-or-nothing."""

    def __init__(self, num_pages: int):
        self.num_pages = num_pages
        self._refs = [0] * num_pages
        self._map = bytearray([_FREE]) * num_pages  # one byte per page: _FREE or _TAKEN
        self._num_free = num_pages
        self._cursor = 0  # where the next search starts: the end of the previous allocation

    @property
    def num_free(self) -> int:
        return self._num_free

    def ref_count(self, page: int) -> int:
        return self._refs[page]

    def is_free(self, page: int) -> bool:
        return self._map[page] == _FREE

    def allocate(self, count: int, follow: int | None = None) -> list[int] | None:
        """Take `count` free pages, each with one reference, or None (and change nothing): the ids
        after page `follow` when they are free, else the first run of `count` consecutive free ids
        from the cursor (wrapping), else the first `count` free ids from the cursor."""
        if count > self._num_free:
            return None
        if count <= 0:
            return []
        first = self._run(count, follow)
        pages = list(range(first, first + count)) if first >= 0 else self._scattered(count)
        for page in pages:
            self._map[page] = _TAKEN
            self._refs[page] = 1
        self._num_free -= count
        self._cursor = (pages[-1] + 1) % self.num_pages
        return pages

    def _run(self, count: int, follow: int | None) -> int:
        """The first id of a free run of `count` ids (after `follow` if that one is free), or -1."""
        if follow is not None and 0 <= follow < self.num_pages - count:
            after = follow + 1
            if self._map.find(_TAKEN_BYTE, after, after + count) < 0:
                return after
        pattern = _FREE_BYTE * count
        first = self._map.find(pattern, self._cursor)
        if first < 0:
            first = self._map.find(pattern, 0, min(self.num_pages, self._cursor + count - 1))
        return first

    def _scattered(self, count: int) -> list[int]:
        """The first `count` free ids from the cursor, wrapping (there are at least `count`)."""
        pages: list[int] = []
        position, wrapped = self._cursor, False
        while len(pages) < count:
            page = self._map.find(_FREE_BYTE, position)
            if page < 0:
                if wrapped:
                    raise PageAccountingError("the free count exceeds the free pages")
                position, wrapped = 0, True
                continue
            pages.append(page)
            position = page + 1
        return pages

    def retain(self, pages: list[int]) -> None:
        """Add one reference to each page; a page at zero must be parked by the caller, not free."""
        for page in pages:
            if self._map[page] == _FREE:
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
        """Return unreferenced, non-free pages to the free pages."""
        for page in pages:
            if self._refs[page] != 0 or self._map[page] == _FREE:
                raise PageAccountingError(f"page {page} cannot be freed (refs {self._refs[page]})")
            self._map[page] = _FREE
            self._num_free += 1

    def free_pages(self) -> list[int]:
        """The free page ids, ascending."""
        return [page for page, state in enumerate(self._map) if state == _FREE]
