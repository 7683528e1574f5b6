"""Cache policy per request: prefix reuse, restore, growth, publication, release, checkpoints.

`CacheManager` mutates a `RequestState`'s page table, chain digests and computed counter, the
shared `PagePool` and the `SnapshotStore`; it never touches slots or queues (the scheduler does).
Every method either completes or returns None having undone what it did.

Reuse rules derived from the storage layout:
- complete pages are reused through the prefix cache only when pages alone capture a prefix's
  state (no recurrent or continuation regions); otherwise only snapshots are reused;
- at least one prompt token is always recomputed, so the first row can sample;
- a scored-prefill request reuses nothing until its prompt is scored (every prompt token needs
  its score); it publishes its pages like any other request;
- requests with the same prompt (the choices of one request) share it through `PromptGroups`:
  one prefills, the others wait for it and then compute only the prompt's last token, on its
  pages (see `prompt_sharing`), or on the prompt held for them when it ended first
  (`hold_prompt`); not on a layout with a window region, where they reuse the prompt through the
  prefix caches.

A layout with a window region of its own page ids (`StorageLayout.window_region`) keeps a second
table per request through `WindowPages` (its module docstring: release, prefix reuse, snapshots);
every method here changes both tables together or neither.

Sliding-window release (`release_outside_window`, layouts whose paged regions are all sliding
windows): once a round's completion commits history up to n, the leading pages below position
n - window + 1 are read by no later query, and every round that read them has completed (rounds
complete in order; a round still in flight queries at positions >= n), so the request drops them.
Its page_ids keep their positions (RELEASED_PAGE in place of a released id). Published pages park
in the prefix cache as any released page does, intact until evicted, so prefix hits over them stay
exact (a lookup reuses only a leading run of cached pages). A request that released pages is never
checkpointed (a snapshot would lack them): preemption recomputes it and no final snapshot is
published; later requests reuse its prefix only through the pages still cached.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from helios.runtime.records.capacities import StorageLayout
from helios.runtime.cache.page_pool import PagePool
from helios.runtime.records.plan import CopyOp, Location, StorageKind
from helios.runtime.cache.prefix_cache import extend_chain
from helios.runtime.cache.prompt_sharing import HeldPrompt, PromptGroups, holds_prompt, prompt_key
from helios.runtime.records.request import RELEASED_PAGE, RequestState
from helios.runtime.cache.snapshots import FenceKind, Residence, Snapshot, SnapshotStore
from helios.runtime.cache.window_pages import WindowPages

Fence = tuple[int, FenceKind]


class CopyWork(NamedTuple):
    """Copies a plan must carry and the snapshot fences they settle."""

    copies: tuple[CopyOp, ...] = ()
    fences: tuple[Fence, ...] = ()


class CacheManager:
    def __init__(self, pool: PagePool, snapshots: SnapshotStore, layout: StorageLayout,
                 prefix_caching: bool = True, window_pool: PagePool | None = None):
        """`window_pool`: the pages of the layout's window region (required exactly when it has one)."""
        self.pool = pool
        self.snapshots = snapshots
        self.layout = layout
        self.prefix_caching = prefix_caching
        self.page_reuse = prefix_caching and layout.pages_capture_state
        region = layout.window
        if (region is None) != (window_pool is None):
            raise ValueError("a window pool is given exactly for a layout with a window region")
        self.window = None if region is None else WindowPages(
            window_pool, region.window_tokens, layout.page_tokens, self.page_reuse)
        self.num_lookup_tokens = 0
        self.num_reused_tokens = 0
        self.groups = PromptGroups(layout.page_tokens)
        self._short_chains: list[RequestState] = []  # admitted with a chain short of their pages

    # -- admission -----------------------------------------------------------------------------

    def admit(self, req: RequestState, budget: int) -> tuple[int, CopyWork] | None:
        """Give a waiting request (slot already assigned) its reused prefix and the pages for its
        first row of at most `budget` (>= 1) tokens: from a running request with the same prompt
        when one holds it (`prompt_sharing`), else from the prefix cache or a snapshot. Returns
        (row length, the copies its plan must run first) or None (too few pages, or its private
        snapshot waits for a continuation row: `_admit_own`)."""
        reuse = self.prefix_caching and not (req.spec.score_prompt and req.num_output_tokens == 0)
        key = self.group_key(req)
        source = self.groups.source(key) if self._may_share(req, reuse) else None
        if source is not None or self.window is not None or self.snapshots.has_published:
            # Their lookups read the whole chain; a plain admission digests only as far as its
            # prefix lookup reads (`_admit_own`), the rest while the device runs (`complete_chains`).
            self.extend_chain(req, len(req.token_ids) // self.layout.page_tokens)
        admitted = self._admit_onto(req, source, key) if source is not None else None
        if admitted is not None:
            return admitted
        admitted = self._admit_own(req, budget, reuse)
        if admitted is not None:
            self.groups.join(req, key)
        return admitted

    def is_waiting_for_source(self, req: RequestState) -> bool:
        """A waiting request should not be admitted yet: a running request with the same prompt is
        computing it and will share its pages (see `prompt_sharing`)."""
        reuse = self.prefix_caching and not req.spec.score_prompt
        if not self._may_share(req, reuse):
            return False
        key = self.group_key(req)
        return self.groups.source(key) is None and self.groups.is_computing(key)

    @staticmethod
    def group_key(req: RequestState) -> bytes:
        """The request's prompt group digest, computed once (its root and prompt never change)."""
        if not req.prompt_key:
            req.prompt_key = prompt_key(req, keyed_tokens(req))
        return req.prompt_key

    def _may_share(self, req: RequestState, reuse: bool) -> bool:
        """Whether `req` may wait for and share a source's prompt: not on a layout with a window
        region (`_admit_onto` gives no window table, and no copy reaches that region's pages)."""
        return (reuse and self.page_reuse and self.window is None and req.num_output_tokens == 0
                and req.num_prompt_tokens > 1)

    def _admit_onto(self, req: RequestState, source: int, key: bytes) -> tuple[int, CopyWork] | None:
        """Admit `req` onto a holder's prompt: all but the last prompt token reused (complete pages
        from the prefix cache, the leading tokens of the last token's page copied from the holder's,
        page `source`, into a private page, followed by the layout's lookahead pages); one token to
        compute. None (nothing changed) when a complete page is no longer cached or no page is free."""
        num_shared, partial = divmod(req.num_prompt_tokens - 1, self.layout.page_tokens)
        shared = self.pool.cache.lookup(req.chain[:num_shared])
        if len(shared) < num_shared:
            return None
        self.pool.retain(shared)
        # the last prompt token's page, and the pages a shifted view references past it
        fresh = self.allocate(self.layout.pages_for(req.num_prompt_tokens) - num_shared)
        if fresh is None:
            self.pool.release(list(reversed(shared)))
            return None
        if req.snapshot_id:
            self.snapshots.discard(req.snapshot_id)
            req.snapshot_id = 0
        req.page_ids = shared + fresh
        req.num_computed_tokens = req.num_prompt_tokens - 1
        req.num_published_pages = num_shared
        req.num_released_pages = 0
        if req.num_reused_tokens < 0:
            req.num_reused_tokens = req.num_computed_tokens
            self.num_lookup_tokens += req.num_prompt_tokens
            self.num_reused_tokens += req.num_computed_tokens
        self.groups.join(req, key)
        self.groups.num_shared_admissions += 1
        if not partial or fresh[0] == source:  # (the held page itself, freed to make room: its tokens are in place)
            return 1, CopyWork()
        copy = CopyOp(Location(StorageKind.PAGE, source), Location(StorageKind.PAGE, fresh[0]), partial)
        return 1, CopyWork((copy,))

    def _admit_own(self, req: RequestState, budget: int, reuse: bool) -> tuple[int, CopyWork] | None:
        """Admission from the prefix cache or a snapshot (or nothing reused)."""
        page_tokens = self.layout.page_tokens
        num_tokens = len(req.token_ids)
        hits = []
        if reuse and self.page_reuse:
            limit = (num_tokens - 1) // page_tokens
            extend_chain(req.chain, req.root, keyed_tokens(req), page_tokens, limit, self.pool.cache)
            hits = self.pool.cache.lookup(req.chain[:limit])
            if len(req.chain) < num_tokens // page_tokens:
                self._short_chains.append(req)
        window_first, window_shared = 0, []
        if self.window is not None:  # only as much of the hit as the window region still holds
            num_hits, window_first, window_shared = self.window.reusable(req.chain, len(hits))
            hits = hits[:num_hits]
        snapshot = self._restore_source(req, reuse)
        if snapshot is not None and snapshot.endpoint <= len(hits) * page_tokens:
            snapshot = None
        elif snapshot is not None and not self.snapshots.can_restore(snapshot):
            if snapshot.owner is not None:
                # Its own state, staged through a continuation row all of which plans in flight or
                # this one copy through: the row is free at their fence (this request holds none), so
                # it waits rather than drop the snapshot and compute its whole history again.
                return None
            snapshot = None
        if req.snapshot_id and (snapshot is None or snapshot.snapshot_id != req.snapshot_id):
            self.snapshots.discard(req.snapshot_id)
            req.snapshot_id = 0
        shared, num_restored, computed = self._base(snapshot, hits)
        chunk = self.until_boundary(req, computed, min(num_tokens - computed, budget))
        self.pool.retain(shared)
        if snapshot is not None:
            self.snapshots.hold(snapshot)
        fresh = self.allocate(self.layout.pages_for(computed + chunk) - len(shared), _last_page(shared))
        if fresh is None or (self.window is not None and not self.window.admit(
                req, window_first, window_shared, len(shared) + len(fresh))):
            self.pool.release(list(reversed(shared + (fresh or []))))
            if snapshot is not None:
                self.snapshots.unhold(snapshot)
            return None
        req.page_ids = shared + fresh
        req.num_computed_tokens = computed
        req.num_published_pages = len(shared)
        req.num_released_pages = 0
        if req.num_reused_tokens < 0:
            req.num_reused_tokens = computed
            self.num_lookup_tokens += num_tokens
            self.num_reused_tokens += computed
        if snapshot is None:
            return chunk, CopyWork()
        req.snapshot_id = 0
        num_shared = len(shared) if snapshot.residence == Residence.HOST else 0
        restored = fresh[:num_restored + (snapshot.endpoint % page_tokens > 0)]
        copies = self.snapshots.restore_copies(snapshot, num_shared, restored, req.slot)
        return chunk, CopyWork(tuple(copies), ((snapshot.snapshot_id, FenceKind.RESTORE),))

    def _restore_source(self, req: RequestState, reuse: bool) -> Snapshot | None:
        """The snapshot to restore `req` from: its own private one (a preempted request's) when its
        capture completed, else the longest ready published one it extends. A private snapshot still
        being written, or dropped (its capture failed), does not end the search: a published state
        (its prompt's, say) still spares recomputing from position 0."""
        if req.snapshot_id:
            snapshot = self.snapshots.get(req.snapshot_id)
            if snapshot is not None and snapshot.ready:
                return snapshot
        if not reuse:
            return None
        return self.snapshots.find(keyed_tokens(req), req.chain, req.root)

    def _base(self, snapshot: Snapshot | None, hits: list[int]) -> tuple[list[int], int, int]:
        """(pages to share, complete pages to copy from the host, computed tokens)."""
        if snapshot is None:
            return hits, 0, len(hits) * self.layout.page_tokens
        num_complete = snapshot.endpoint // self.layout.page_tokens
        if snapshot.residence == Residence.DEVICE:
            return list(snapshot.page_ids), 0, snapshot.endpoint
        shared = hits[:num_complete]
        return shared, num_complete - len(shared), snapshot.endpoint

    def allocate(self, count: int, follow: int | None = None) -> list[int] | None:
        """`count` pages: free, then evicted LRU parked pages, then pages of dropped published
        snapshots (least recently used first, idle ones only), then of dropped held prompts (oldest
        first: their waiting members prefill as any request does); or None. Consecutive ids where a run
        is free, those right after page `follow` first (`PageAllocator`)."""
        while True:
            pages = self.pool.allocate(count, follow)
            if pages is not None or not (self.snapshots.drop_lru_device() or self._drop_a_hold()):
                return pages

    # -- running requests ----------------------------------------------------------------------

    def grow(self, req: RequestState, num_tokens: int) -> list[int] | None:
        """Pages so that `req` holds positions [0, num_tokens) in every view; new pages or None."""
        missing = self.layout.pages_for(num_tokens) - len(req.page_ids)
        if missing <= 0:
            return []
        window = self.window.allocate(missing) if self.window is not None else []
        if window is None:
            return None
        pages = self.allocate(missing, _last_page(req.page_ids))
        if pages is None:
            if self.window is not None:
                self.window.unallocate(window)
            return None
        req.page_ids.extend(pages)
        if self.window is not None:
            req.window_ids.extend(window)
        return pages

    def shortfall(self, req: RequestState, num_tokens: int) -> int:
        """Pages missing for `req` to hold `num_tokens` positions, in the scarcer page-id space."""
        missing = self.layout.pages_for(num_tokens) - len(req.page_ids)
        short = missing - self.pool.num_available
        if self.window is not None:
            short = max(short, missing - self.window.pool.num_available)
        return short

    def extend_chain(self, req: RequestState, num_pages: int) -> None:
        extend_chain(req.chain, req.root, keyed_tokens(req), self.layout.page_tokens, num_pages)

    def complete_chains(self) -> None:
        """Digests the complete pages admissions left undigested (an admission digests only as far
        as its lookup reads): the scheduler calls it while their plan runs on the device, so that
        work is not on the path to the first token (`publish` would do it after the plan otherwise)."""
        short, self._short_chains = self._short_chains, []
        for req in short:
            self.extend_chain(req, len(req.token_ids) // self.layout.page_tokens)

    def publish(self, req: RequestState) -> None:
        """Make the request's newly committed complete pages findable (after validation only)."""
        if not self.page_reuse:
            return
        committed = min(req.num_computed_tokens, len(req.token_ids))
        num_complete = committed // self.layout.page_tokens
        if num_complete <= req.num_published_pages:
            return
        self.extend_chain(req, num_complete)
        for index in range(req.num_published_pages, num_complete):
            self.pool.publish(req.chain[index], req.page_ids[index])
        req.num_published_pages = num_complete
        if self.window is not None:
            self.window.publish(req, num_complete)

    def commit_work(self) -> tuple[int, bool]:
        """(page size when `publish` may publish anything, else 0; whether `release_outside_window`
        may release anything): `publish` changes nothing for a request unless its committed
        history, min(computed, known tokens), fills more pages than it published, and without a
        window region or a release window `release_outside_window` never releases."""
        publishes = self.layout.page_tokens if self.page_reuse else 0
        return publishes, self.window is not None or self.layout.release_window > 0

    def release(self, req: RequestState) -> None:
        """Drop the request's page references, tails first (so they are evicted first)."""
        self.groups.leave(req)
        self.pool.release([page for page in reversed(req.page_ids) if page != RELEASED_PAGE])
        if self.window is not None:
            self.window.release(req)
        req.page_ids = []
        req.num_uploaded_pages = 0
        req.num_published_pages = 0
        req.num_released_pages = 0

    def hold_prompt(self, req: RequestState) -> None:
        """`req` ends (before `release` or `checkpoint`) while requests of its prompt group wait:
        when it holds the prompt's first P - 1 tokens and no other member (nor a held prompt)
        does, keep a reference to each of those pages it still holds, for them (`prompt_sharing`)."""
        if not (self.page_reuse and self.window is None and req.num_prompt_tokens > 1):
            return
        key = self.group_key(req)
        if not holds_prompt(req, self.layout.page_tokens, running=False) or self.groups.has_other_holder(req, key):
            return
        num_shared, partial = divmod(req.num_prompt_tokens - 1, self.layout.page_tokens)
        pages = tuple(page for page in req.page_ids[:num_shared + (partial > 0)] if page != RELEASED_PAGE)
        self.pool.retain(pages)
        self.groups.held[key] = HeldPrompt(pages, req.page_ids[num_shared] if partial else RELEASED_PAGE)
        self.groups.num_holds += 1

    def drop_holds(self, is_awaited: Callable[[bytes], bool]) -> None:
        """Release the held prompts whose group no request awaits. Only between steps: a plan that
        copied from one was launched before, so it runs before any plan that reuses its pages."""
        for key in [key for key in self.groups.held if not is_awaited(key)]:
            self._release_hold(key)

    def _drop_a_hold(self) -> bool:
        """Release the oldest held prompt (page pressure); False when none is held. Within a step
        too: the plan's copies, which run in order before its program, read the held page before
        any copy or row of the plan writes it again."""
        if not self.groups.held:
            return False
        self._release_hold(next(iter(self.groups.held)))
        return True

    def _release_hold(self, key: bytes) -> None:
        held = self.groups.held.pop(key)
        self.pool.release(list(reversed(held.page_ids)))

    def release_outside_window(self, req: RequestState) -> int:
        """After a completion committed `req`'s history: drop the leading pages no later query reads
        (see the module docstring). Returns how many pages were released now (0 for layouts that
        keep every page; with a window region, the window pages released)."""
        if self.window is not None:
            return self.window.release_outside(req)
        count = min(self.layout.releasable_pages(req.num_computed_tokens), req.num_uploaded_pages)
        if count <= req.num_released_pages:
            return 0
        first, pages = req.num_released_pages, req.page_ids[req.num_released_pages:count]
        req.page_ids[first:count] = [RELEASED_PAGE] * len(pages)
        req.num_released_pages = count
        self.pool.release(list(reversed(pages)))
        return len(pages)

    def checkpoint(self, req: RequestState, residence: Residence) -> CopyWork | None:
        """Checkpoint the committed state and release the request's other pages.

        Device checkpoints are published for later requests (owner None), unless that state is
        published already; host checkpoints are private to a preempted request. Returns the copies,
        or None with nothing changed (the caller then releases as usual).
        """
        endpoint = min(req.num_computed_tokens, len(req.token_ids))
        if endpoint == 0 or req.num_released_pages or self.window is not None or (
                residence == Residence.DEVICE and not self.snapshots.needs_tail(endpoint)):
            return None
        if req.num_computed_tokens > len(req.token_ids) and not self.layout.pages_capture_state:
            # Its state consumed tokens past its history (a speculative lane went on past an EOS it
            # emitted): no endpoint of the history holds that state. (Pages below it are intact.)
            return None
        page_tokens = self.layout.page_tokens
        num_complete = endpoint // page_tokens
        self.extend_chain(req, num_complete)
        key = req.chain[num_complete - 1] if num_complete else req.root
        covered = -(-endpoint // page_tokens)
        owner = req.request_id if residence == Residence.HOST else None
        token_ids = tuple(keyed_tokens(req)[:endpoint])
        if owner is None and self.snapshots.is_published(token_ids, key):
            return None  # that state is published already (another request ended there)
        result = self.snapshots.capture(token_ids, key, req.page_ids[:covered], req.slot, owner, residence)
        if result is None:
            return None
        snapshot, copies = result
        req.page_ids = req.page_ids[covered:]
        self.release(req)
        if owner is not None:
            req.snapshot_id = snapshot.snapshot_id
        return CopyWork(tuple(copies), ((snapshot.snapshot_id, FenceKind.CAPTURE),))

    @property
    def publishes_prompt_snapshots(self) -> bool:
        """Whether prompt boundaries are snapshotted: prefix caching on a layout whose pages do not
        hold the state (there, snapshots are the only prefix reuse)."""
        return self.prefix_caching and not self.layout.pages_capture_state

    def until_boundary(self, req: RequestState, start: int, tokens: int) -> int:
        """A prompt row of `tokens` from `start`, cut to end at the request's stable prefix when it
        would run past it and a snapshot is to be published there (`RequestState.stable_boundary`)."""
        boundary = req.stable_boundary if self.publishes_prompt_snapshots else 0
        return boundary - start if start < boundary < start + tokens else tokens

    def checkpoint_prompt(self, req: RequestState, endpoint: int | None = None) -> CopyWork | None:
        """Publish a snapshot of the request's committed state at `endpoint` (default: its prompt
        boundary; or the end of its stable prefix), keeping its pages (complete pages are shared by
        reference, the partial page and state rows are copied to a continuation row). Only where
        `publishes_prompt_snapshots`. None when not applicable, already published (or being captured
        for another request that reached the same state), or no row is free;
        also when the request released pages outside its sliding window (a layout with recurrent
        state whose paged regions all slide): as with `checkpoint`, a snapshot would lack them."""
        endpoint = req.num_prompt_tokens if endpoint is None else endpoint
        if not self.publishes_prompt_snapshots or endpoint == 0 or req.num_released_pages:
            return None
        page_tokens = self.layout.page_tokens
        num_complete = endpoint // page_tokens
        self.extend_chain(req, num_complete)
        keyed = keyed_tokens(req)
        key = req.chain[num_complete - 1] if num_complete else req.root
        if self.snapshots.is_published(keyed[:endpoint], key):
            return None  # the same prompt's state is published, or being captured (a request beside it)
        pages = req.page_ids[:-(-endpoint // page_tokens)]
        self.pool.retain(pages)  # the snapshot's own references; the request keeps its pages
        result = self.snapshots.capture(tuple(keyed[:endpoint]), key, pages, req.slot, None,
                                        Residence.DEVICE)
        if result is None:
            self.pool.release(list(reversed(pages)))
            return None
        snapshot, copies = result
        return CopyWork(tuple(copies), ((snapshot.snapshot_id, FenceKind.CAPTURE),))

    def page_holders(self, requests: list[RequestState]) -> list[int]:
        held = self.snapshots.page_holders()
        for prompt in self.groups.held.values():
            held.extend(prompt.page_ids)
        for req in requests:
            held.extend(page for page in req.page_ids if page != RELEASED_PAGE)
        return held


def _last_page(page_ids: list[int]) -> int | None:
    """The page new pages should follow (a table's last page), or None."""
    return page_ids[-1] if page_ids and page_ids[-1] != RELEASED_PAGE else None


def keyed_tokens(req: RequestState):
    """The ids the prefix cache digests: the request's tokens, with its declared `token_keys` (image
    feature tokens: their image's content hash) in place of the ids at those positions."""
    keys = req.spec.token_keys
    if not keys:
        return req.token_ids
    ids = list(req.token_ids)
    for index, key in keys:
        if index < len(ids):
            ids[index] = key
    return ids
