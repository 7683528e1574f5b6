"""The page-id space of a sliding-window region that owns its pages (`StorageLayout.window_region`).

A model whose layers mix sliding-window and full attention (gpt-oss) keeps the sliding layers'
keys/values in a region of their own: its planes are sized by WINDOW_PAGES and addressed by a page
table of their own. Every request holds two tables of equal length over the same logical pages
(entry i covers positions [i * page_tokens, (i + 1) * page_tokens)): `RequestState.page_ids` (every
other paged region, every page kept) and `RequestState.window_ids` (this region). `WindowPages`
owns the second pool and its prefix cache; `CacheManager` calls it beside every change of the first.

Release: a query at position p reads (p - window, p], so once a completion commits history up to n
the window pages below index (n - window + 1) // page_tokens are read by no later query (rounds
complete in order; one still in flight queries at positions >= n). They are released (entry
RELEASED_PAGE) as soon as they were uploaded; a published one parks in this region's prefix cache.

Prefix reuse: a prefix of k complete pages found in the main prefix cache is reusable only when the
window pages a query at position k * page_tokens reads, [first_read(k * page_tokens), k), are all
cached here too (chained digests key both caches alike); the longest such k <= the main hit wins and
the entries below first_read start RELEASED. So a hit never needs a page that fell out of the window.

Snapshots: a request of such a layout is never checkpointed (its released pages are gone), so a
preempted or offloaded request is recomputed, reusing what both prefix caches still hold.
Released entries reach the device table as page 0 (`UNHELD_PAGE_ID`): a valid id that the window
masks (it is never read for a visible position), so kernels never address a negative page.
"""

from __future__ import annotations

import math

from helios.contract import PreparedContract
from helios.contract import manifest_pb2 as mpb
from helios.errors import LoadError
from helios.runtime.cache.page_pool import PagePool
from helios.runtime.records.request import RELEASED_PAGE, RequestState

UNHELD_PAGE_ID = 0  # what a released or never-held window entry uploads as (masked by the window)


def window_region_name(prepared: PreparedContract) -> str:
    """The region whose planes are sized by WINDOW_PAGES (it owns its page ids), or ""."""
    extents = {b.name: {d.load_extent for d in b.shape if d.WhichOneof("extent") == "load_extent"}
               for b in prepared.manifest.buffers}
    for region in prepared.contract.model.cache.regions:
        if any(mpb.LOAD_EXTENT_WINDOW_PAGES in extents.get(plane, ()) for plane in region.planes):
            return region.name
    return ""


def window_view_names(prepared: PreparedContract) -> frozenset[str]:
    """Page-table destinations whose ids address the window region's own space."""
    region = window_region_name(prepared)
    return frozenset(v.destination for v in prepared.contract.model.cache.page_table_views if region and v.region == region)


class WindowPagesError(LoadError):
    """An explicit window page count below what one request needs to make progress."""


def _window_of(prepared: PreparedContract) -> tuple[int, int] | None:
    name = window_region_name(prepared)
    if not name:
        return None
    cache = prepared.contract.model.cache
    return next(r.window_tokens for r in cache.regions if r.name == name), cache.page_tokens


def window_page_count(prepared: PreparedContract, max_active: int, row_tokens: int, context_pages: int,
                      requested: int | None = None) -> int:
    """The window region's page count: `requested` when given (at least `min_window_pages`, else
    `WindowPagesError`), else enough that the window pool is never what a request waits for: per
    active request the pages of (window - 1) positions behind its committed history plus two rounds in
    flight of at most `row_tokens` each, one page of alignment on either side; at most a full
    context's pages per request. 0 without a window region."""
    found = _window_of(prepared)
    if found is None:
        return 0
    window, page_tokens = found
    if requested is not None:
        least = min_window_pages(window, page_tokens, row_tokens)
        if requested < least:
            raise WindowPagesError(f"{requested} window pages cannot hold one request's window and one round "
                                   f"of {row_tokens} tokens; at least {least} are needed")
        return requested
    per_request = math.ceil((window - 1 + 2 * row_tokens) / page_tokens) + 2
    return max_active * min(per_request, context_pages)


def min_window_pages(window: int, page_tokens: int, row_tokens: int) -> int:
    """Window pages one request needs for a round of `row_tokens` tokens: the (window - 1) positions
    before it and the round's own, one page of alignment on either side."""
    return math.ceil((window - 1 + row_tokens) / page_tokens) + 2


class WindowPages:
    """The window region's pool and the per-request policy over `RequestState.window_ids`.

    Every method either completes or changes nothing (allocation returns None)."""

    def __init__(self, pool: PagePool, window_tokens: int, page_tokens: int, page_reuse: bool):
        self.pool = pool
        self.window_tokens = window_tokens
        self.page_tokens = page_tokens
        self.page_reuse = page_reuse

    def first_read(self, position: int) -> int:
        """Index of the first page a query at `position` (or later) reads."""
        return max(0, position - self.window_tokens + 1) // self.page_tokens

    def reusable(self, chain: list[bytes], num_hits: int) -> tuple[int, int, list[int]]:
        """(k, first, pages): the most leading pages k <= `num_hits` of a main prefix hit whose
        window pages [first, k) are cached here, and those pages. Changes nothing."""
        if not self.page_reuse:
            return 0, 0, []
        for k in range(num_hits, 0, -1):
            first = self.first_read(k * self.page_tokens)
            pages = self.pool.cache.lookup(chain[first:k])
            if len(pages) == k - first:
                return k, first, pages
        return 0, 0, []

    def admit(self, req: RequestState, first: int, shared: list[int], num_pages: int) -> bool:
        """Give `req` the table [RELEASED] * first + shared + fresh pages up to `num_pages` entries."""
        self.pool.retain(shared)
        fresh = self.pool.allocate(num_pages - first - len(shared))
        if fresh is None:
            self.pool.release(list(reversed(shared)))
            return False
        req.window_ids = [RELEASED_PAGE] * first + shared + fresh
        req.num_window_released = first
        req.num_window_published = first + len(shared)
        return True

    def allocate(self, count: int) -> list[int] | None:
        return self.pool.allocate(count) if count > 0 else []

    def unallocate(self, pages: list[int]) -> None:
        """Return pages `allocate` gave that were never handed to a request."""
        self.pool.release(list(reversed(pages)))

    def publish(self, req: RequestState, num_complete: int) -> None:
        """Make the request's complete window pages up to `num_complete` findable (chain digests)."""
        if not self.page_reuse:
            return
        for index in range(req.num_window_published, min(num_complete, len(req.window_ids))):
            page = req.window_ids[index]
            if page != RELEASED_PAGE:
                self.pool.publish(req.chain[index], page)
        req.num_window_published = max(req.num_window_published, num_complete)

    def release_outside(self, req: RequestState) -> int:
        """Release the uploaded entries no later query reads (module docstring); how many now."""
        count = min(self.first_read(req.num_computed_tokens), req.num_uploaded_pages, len(req.window_ids))
        if count <= req.num_window_released:
            return 0
        first, pages = req.num_window_released, req.window_ids[req.num_window_released:count]
        req.window_ids[first:count] = [RELEASED_PAGE] * (count - first)
        req.num_window_released = count
        held = [page for page in pages if page != RELEASED_PAGE]
        self.pool.release(list(reversed(held)))
        return len(held)

    def release(self, req: RequestState) -> None:
        """Drop every window page the request holds, tails first."""
        self.pool.release([page for page in reversed(req.window_ids) if page != RELEASED_PAGE])
        req.window_ids = []
        req.num_window_released = 0
        req.num_window_published = 0

    def holders(self, requests: list[RequestState]) -> list[int]:
        return [page for req in requests for page in req.window_ids if page != RELEASED_PAGE]
