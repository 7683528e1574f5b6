"""Snapshot bookkeeping: complete committed state at exact token endpoints.

A snapshot of endpoint E holds the E // page_tokens complete pages (on the device: one page
reference each; offloaded: one host slot each) and a tail: the partial page's payload and any
carried state, in a continuation row (device) or a host slot. Complete pages are immutable and
shared by reference; restoring copies the tail into a private writable page (and the slot's
state rows), and host-resident pages into freshly allocated private pages.

On a core with state programs (`StorageLayout.restores_through_programs`), a tail that carries
state was written into its continuation row by the core (a SNAPSHOT program writes snapshot rows in
whatever form its RESTORATION program reads back: the runtime does not know it). Offloading such a
tail copies those bytes to a host slot as they are, so its restore copies them into a continuation
row first and restores the slot's state rows from there (through the core's RESTORATION program,
like a device snapshot's), not from the host slot directly; that row is held until the snapshot's
restores in flight settle. While no continuation row can be had (`can_restore`), such a snapshot
is not restored: a request computes a published one's prefix instead, and waits for a row to
restore its own private one (`CacheManager.admit`). A preempted request's private snapshot
keeps the same contract: its capture runs the slot's state rows through the SNAPSHOT program into a
continuation row (held until the capture settles) and copies that row to its host tail, so it is
restored the same way; with no continuation row or too few host slots to be had, the capture
fails (the request is recomputed) having evicted nothing for the other. A core without state
programs keeps raw state rows in both, so they go straight back.

Byte copies are requested as `CopyOp`s that travel in a plan; the scheduler reports each plan's
outcome through `settle`. A snapshot being written (capture or offload) is unusable until its
copies complete; a failed capture is dropped, never published; a failed offload leaves the
snapshot on the device. Pages read or written by in-flight copies stay referenced (`fenced`)
until `settle`. Published snapshots (owner None) are indexed for prefix lookup from their capture
(lookups skip them until it completes; `is_published` does not, so a state reached by two requests
at once is captured once) and evicted in LRU order; private snapshots belong to one preempted
request and are consumed by its restore.
"""

from __future__ import annotations

import enum
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Sequence

from helios.runtime.records.capacities import StorageLayout
from helios.runtime.records.faults import require
from helios.runtime.cache.page_pool import PagePool
from helios.runtime.records.plan import CopyOp, Location, StorageKind


class Residence(enum.IntEnum):
    DEVICE = 1
    HOST = 2


class FenceKind(enum.IntEnum):
    """What an in-flight plan does to a snapshot."""

    CAPTURE = 1  # writes it for the first time
    OFFLOAD = 2  # copies it from the device to the host
    RESTORE = 3  # reads it into a request's pages


class IdPool:
    """Free list of small integer ids (continuation rows, host slots)."""

    def __init__(self, size: int):
        self.size = size
        self._free: deque[int] = deque(range(size))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def take(self, count: int) -> list[int] | None:
        if count > len(self._free):
            return None
        return [self._free.popleft() for _ in range(count)]

    def give(self, ids: Sequence[int]) -> None:
        self._free.extend(ids)

    def free_ids(self) -> set[int]:
        return set(self._free)


@dataclass(eq=False)
class Snapshot:
    """One checkpoint. Mutated only by `SnapshotStore`."""

    snapshot_id: int
    token_ids: tuple[int, ...]  # keyed (`cache_manager.keyed_tokens`): an image's tokens by its content hash
    key: bytes  # chain digest of its last complete page (the root digest when it has none)
    owner: str | None  # the preempted request it belongs to, or None when published
    residence: Residence
    page_ids: list[int] = field(default_factory=list)
    host_slots: list[int] = field(default_factory=list)
    tail: Location | None = None
    ready: bool = False
    writing: bool = False
    num_readers: int = 0
    doomed: bool = False
    fenced_pages: list[int] = field(default_factory=list)
    pending_slots: list[int] = field(default_factory=list)
    offloaded: bool = False  # its host tail holds a continuation row's bytes (`offload`, or a staged private capture)
    # continuation rows its capture (a staged private one) or its restores in flight copy through
    staging_rows: list[int] = field(default_factory=list)

    @property
    def endpoint(self) -> int:
        return len(self.token_ids)

    @property
    def is_busy(self) -> bool:
        return self.writing or self.num_readers > 0


class SnapshotStore:
    """Snapshots, their continuation rows and host slots. Holds page references via the pool."""

    def __init__(self, pool: PagePool, layout: StorageLayout, num_rows: int, num_host_slots: int):
        self._pool = pool
        self._layout = layout
        self._rows = IdPool(num_rows)
        self._host = IdPool(num_host_slots)
        self._snapshots: dict[int, Snapshot] = {}
        self._index: dict[bytes, set[int]] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()  # published and ready, oldest first
        self._next_id = 0
        self.num_published = 0
        self.num_evicted = 0
        self.num_offloaded = 0
        self.num_restored = 0

    def get(self, snapshot_id: int) -> Snapshot | None:
        return self._snapshots.get(snapshot_id)

    def snapshots(self) -> list[Snapshot]:
        return list(self._snapshots.values())

    def needs_tail(self, endpoint: int) -> bool:
        return endpoint % self._layout.page_tokens != 0 or not self._layout.pages_capture_state

    # -- capture -------------------------------------------------------------------------------

    def capture(self, token_ids: tuple[int, ...], key: bytes, pages: list[int], state_slot: int,
                owner: str | None, residence: Residence) -> tuple[Snapshot, list[CopyOp]] | None:
        """Checkpoint `token_ids` (all committed) held in `pages`, taking over their references.

        `pages` are exactly the pages covering the endpoint. Returns the pending snapshot and the
        copies that write it, or None (and the caller keeps its references) when no continuation
        row or host slot can be had.
        """
        page_tokens = self._layout.page_tokens
        num_complete, partial = divmod(len(token_ids), page_tokens)
        require(len(pages) == num_complete + (partial > 0), "capture pages do not cover the endpoint")
        has_tail = self.needs_tail(len(token_ids))
        staging: list[int] = []
        if residence == Residence.DEVICE:
            ids = self._take(self._rows, int(has_tail), Residence.DEVICE)
        elif has_tail and self._through_programs:  # staged through a continuation row (module docstring)
            # Both or neither: snapshots evicted for one kind would be lost for nothing without the other.
            row_holders = self._holders(self._rows, 1, Residence.DEVICE)
            slot_holders = self._holders(self._host, num_complete + 1, Residence.HOST)
            if row_holders is None or slot_holders is None:
                return None
            for holder in row_holders + slot_holders:
                self._drop(holder)
                self.num_evicted += 1
            staging, ids = self._rows.take(1), self._host.take(num_complete + 1)
        else:
            ids = self._take(self._host, num_complete + int(has_tail), Residence.HOST)
        if ids is None:
            return None
        snapshot = Snapshot(self._new_id(), token_ids, key, owner, residence, writing=True,
                            offloaded=bool(staging), staging_rows=staging)
        copies: list[CopyOp] = []
        if residence == Residence.HOST:
            snapshot.host_slots = ids[:num_complete]
            snapshot.fenced_pages = list(pages)
            for page, slot in zip(pages, snapshot.host_slots):
                copies.append(CopyOp(_page(page), Location(StorageKind.HOST, slot), page_tokens))
        else:
            snapshot.page_ids = pages[:num_complete]
            snapshot.fenced_pages = pages[num_complete:]
        if has_tail:
            kind = StorageKind.CONTINUATION if residence == Residence.DEVICE else StorageKind.HOST
            snapshot.tail = Location(kind, ids[-1])
            copies.extend(self._tail_copies(pages[num_complete] if partial else -1, partial,
                                            snapshot.tail, state_slot, staging))
        self._snapshots[snapshot.snapshot_id] = snapshot
        if owner is None:
            self._index.setdefault(key, set()).add(snapshot.snapshot_id)
        return snapshot, copies

    def _tail_copies(self, page: int, partial: int, tail: Location, state_slot: int,
                     staging: list[int]) -> list[CopyOp]:
        """The partial page and the slot's state rows into `tail`; the state through the
        continuation row `staging` names, if any (the SNAPSHOT program writes it, then its bytes
        go to the host tail: only its state part, the partial page went directly)."""
        copies = []
        if partial:
            copies.append(CopyOp(_page(page), tail, partial))
        if not self._layout.pages_capture_state:
            row = Location(StorageKind.CONTINUATION, staging[0]) if staging else tail
            copies.append(CopyOp(Location(StorageKind.STATE, state_slot), row, 0))
            if staging:
                copies.append(CopyOp(row, tail, 0))
        return copies

    def _take(self, pool: IdPool, count: int, residence: Residence) -> list[int] | None:
        """Ids from `pool`, evicting least recently used published snapshots that hold them."""
        while True:
            ids = pool.take(count)
            if ids is not None or not self._evict_one(residence):
                return ids

    def _holders(self, pool: IdPool, count: int, residence: Residence) -> list[Snapshot] | None:
        """The least recently used idle published snapshots of `residence` to evict so that `pool`
        has `count` ids free (a device one gives back its tail row, a host one its slots), or None
        when evicting every one of them would not do."""
        have, holders = pool.num_free, []
        for snapshot in map(self._snapshots.get, self._lru):
            if have >= count:
                break
            if snapshot.residence != residence or snapshot.is_busy:
                continue
            held = len(snapshot.host_slots) if pool is self._host else 0
            if snapshot.tail is not None and (snapshot.tail.kind == StorageKind.CONTINUATION) == (pool is self._rows):
                held += 1
            if held:
                have += held
                holders.append(snapshot)
        return holders if have >= count else None

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    # -- completion of copies ------------------------------------------------------------------

    def settle(self, snapshot_id: int, kind: FenceKind, ok: bool) -> None:
        """Apply the outcome of the plan that carried this snapshot's copies (its GPU fence)."""
        snapshot = self._snapshots[snapshot_id]
        if kind == FenceKind.RESTORE:
            snapshot.num_readers -= 1
            if ok:  # a restore counts once its copies ran: a failed plan restored nothing
                self.num_restored += 1
            if not snapshot.num_readers:  # no restore in flight reads its staging rows any more
                self._rows.give(snapshot.staging_rows)
                snapshot.staging_rows = []
        else:
            snapshot.writing = False
            self._pool.release(snapshot.fenced_pages)
            snapshot.fenced_pages = []
            self._rows.give(snapshot.staging_rows)  # a staged capture's row (no restore reads it yet)
            snapshot.staging_rows = []
            if kind == FenceKind.CAPTURE:
                self._settle_capture(snapshot, ok)
            else:
                self._settle_offload(snapshot, ok)
        if snapshot.doomed and not snapshot.is_busy:
            self._drop(snapshot)

    def _settle_capture(self, snapshot: Snapshot, ok: bool) -> None:
        if not ok:
            snapshot.doomed = True
            return
        snapshot.ready = True
        if snapshot.owner is None and not snapshot.doomed:  # (indexed since its capture)
            self._lru[snapshot.snapshot_id] = None
            self.num_published += 1

    def _settle_offload(self, snapshot: Snapshot, ok: bool) -> None:
        if not ok:
            self._host.give(snapshot.pending_slots)
            snapshot.pending_slots = []
            return
        self._pool.release(list(reversed(snapshot.page_ids)))
        if snapshot.tail is not None:
            self._rows.give([snapshot.tail.index])
            snapshot.tail = Location(StorageKind.HOST, snapshot.pending_slots[-1])
            snapshot.offloaded = True
        num_complete = len(snapshot.page_ids)
        snapshot.host_slots = snapshot.pending_slots[:num_complete]
        snapshot.page_ids = []
        snapshot.pending_slots = []
        snapshot.residence = Residence.HOST
        self.num_offloaded += 1

    # -- lookup and restore --------------------------------------------------------------------

    @property
    def has_published(self) -> bool:
        """Whether some published snapshot, ready or being captured, is indexed (`find` reads the
        whole chain then)."""
        return bool(self._index)

    def is_published(self, token_ids: Sequence[int], key: bytes) -> bool:
        """Whether a published snapshot, ready or still being captured, holds exactly the state of
        `token_ids` (keyed; `key`: the chain digest of its last complete page, or the root). A second
        capture of it would only take a continuation row from another snapshot, evicting it."""
        token_ids = tuple(token_ids)
        return any(not self._snapshots[snapshot_id].doomed and self._snapshots[snapshot_id].token_ids == token_ids
                   for snapshot_id in self._index.get(key, ()))

    def find(self, token_ids: Sequence[int], chain: Sequence[bytes], root: bytes) -> Snapshot | None:
        """The ready published snapshot with the longest endpoint < len(token_ids) that is a
        prefix of `token_ids`. `chain` holds the digests of the complete pages of `token_ids`; the
        ids are keyed as the chain is (image feature tokens by their image's content hash), so a
        tail of equal placeholder ids from another image never matches."""
        if not self._index:  # nothing published: no page of the chain need be looked up
            return None
        page_tokens = self._layout.page_tokens
        limit = len(token_ids) - 1
        for num_complete in range(min(len(chain), limit // page_tokens), -1, -1):
            key = chain[num_complete - 1] if num_complete else root
            best = None
            start = num_complete * page_tokens
            for snapshot_id in self._index.get(key, ()):
                snapshot = self._snapshots[snapshot_id]
                end = snapshot.endpoint
                if snapshot.writing or end > limit:
                    continue
                if tuple(token_ids[start:end]) == snapshot.token_ids[start:] and (
                        best is None or end > best.endpoint):
                    best = snapshot
            if best is not None:
                return best
        return None

    def restore_copies(self, snapshot: Snapshot, num_shared: int, pages: list[int],
                       state_slot: int) -> list[CopyOp]:
        """Copies rebuilding `snapshot` into a request's private `pages` and state rows.

        A device snapshot's complete pages are shared (the caller retains them), so `pages` holds
        only the tail page, if any. A host snapshot's first `num_shared` complete pages were found
        in the prefix cache; `pages` receives the remaining complete pages and then the tail page.
        The caller holds the snapshot (`hold`) until `settle(..., RESTORE, ...)`, which counts the
        restore (`num_restored`) when its copies ran; a private snapshot is consumed. An offloaded
        tail that carries state is copied back into a continuation row first (module docstring).
        """
        page_tokens = self._layout.page_tokens
        copies = []
        if snapshot.residence == Residence.HOST:
            for slot, page in zip(snapshot.host_slots[num_shared:], pages):
                copies.append(CopyOp(Location(StorageKind.HOST, slot), _page(page), page_tokens))
        partial = snapshot.endpoint % page_tokens
        tail = snapshot.tail
        if self._stages(snapshot):
            tail = self._staging_row(snapshot)
            if tail != snapshot.tail:
                copies.append(CopyOp(snapshot.tail, tail, partial))
        if partial:
            copies.append(CopyOp(tail, _page(pages[-1]), partial))
        if not self._layout.pages_capture_state:
            copies.append(CopyOp(tail, Location(StorageKind.STATE, state_slot), 0))
        if snapshot.owner is not None:
            snapshot.doomed = True
        elif snapshot.snapshot_id in self._lru:
            self._lru.move_to_end(snapshot.snapshot_id)
        return copies

    @property
    def _through_programs(self) -> bool:
        """Whether slot state reaches a host tail and comes back only through a continuation row
        (the core's SNAPSHOT and RESTORATION programs address those rows: module docstring)."""
        return self._layout.restores_through_programs and not self._layout.pages_capture_state

    def _stages(self, snapshot: Snapshot) -> bool:
        """Whether restoring `snapshot` copies its tail into a continuation row first (module docstring)."""
        return snapshot.offloaded and self._through_programs

    def can_restore(self, snapshot: Snapshot) -> bool:
        """Whether `restore_copies` can restore `snapshot` now: one that stages its tail needs a
        continuation row free, or one an idle device snapshot holds (evicted for it)."""
        if not self._stages(snapshot) or self._rows.num_free:
            return True
        return any(s.residence == Residence.DEVICE and not s.is_busy for s in map(self._snapshots.get, self._lru))

    def _staging_row(self, snapshot: Snapshot) -> Location:
        """A continuation row to copy an offloaded tail back into for one restore (held until its
        restores settle), evicting an idle device snapshot for it if need be; the host tail itself
        when every row is busy (never, after `can_restore`)."""
        rows = self._take(self._rows, 1, Residence.DEVICE)
        if rows is None:
            return snapshot.tail
        snapshot.staging_rows.extend(rows)
        return Location(StorageKind.CONTINUATION, rows[0])

    def hold(self, snapshot: Snapshot) -> None:
        """Keep a snapshot from eviction, offload and dropping while a restore reads it."""
        snapshot.num_readers += 1

    def unhold(self, snapshot: Snapshot) -> None:
        """Undo `hold` for a restore that did not happen."""
        snapshot.num_readers -= 1
        if snapshot.doomed and not snapshot.is_busy:
            self._drop(snapshot)

    # -- offload and eviction ------------------------------------------------------------------

    def offload_candidate(self) -> Snapshot | None:
        """The least recently used published device snapshot that could move to the host."""
        for snapshot_id in self._lru:
            snapshot = self._snapshots[snapshot_id]
            if snapshot.residence == Residence.DEVICE and not snapshot.is_busy:
                return snapshot
        return None

    def offload(self, snapshot: Snapshot) -> list[CopyOp] | None:
        """Start moving a ready, idle device snapshot to host slots; None if slots are short."""
        require(snapshot.ready and not snapshot.is_busy, "offload of a busy snapshot")
        count = len(snapshot.page_ids) + (snapshot.tail is not None)
        slots = self._host.take(count)
        if slots is None:
            return None
        page_tokens = self._layout.page_tokens
        copies = [CopyOp(_page(page), Location(StorageKind.HOST, slot), page_tokens)
                  for page, slot in zip(snapshot.page_ids, slots)]
        if snapshot.tail is not None:
            partial = snapshot.endpoint % page_tokens
            copies.append(CopyOp(snapshot.tail, Location(StorageKind.HOST, slots[-1]), partial))
        snapshot.pending_slots = slots
        snapshot.writing = True
        return copies

    def drop_lru_device(self) -> bool:
        """Drop the least recently used idle published device snapshot (page pressure)."""
        return self._evict_one(Residence.DEVICE)

    def _evict_one(self, residence: Residence) -> bool:
        for snapshot_id in self._lru:
            snapshot = self._snapshots[snapshot_id]
            if snapshot.residence == residence and not snapshot.is_busy:
                self._drop(snapshot)
                self.num_evicted += 1
                return True
        return False

    def discard(self, snapshot_id: int) -> None:
        """Give up a snapshot now, or at its last fence when copies are in flight (no-op if gone)."""
        snapshot = self._snapshots.get(snapshot_id)
        if snapshot is None:
            return
        snapshot.doomed = True
        if not snapshot.is_busy:
            self._drop(snapshot)

    def _drop(self, snapshot: Snapshot) -> None:
        del self._snapshots[snapshot.snapshot_id]
        self._lru.pop(snapshot.snapshot_id, None)
        members = self._index.get(snapshot.key)
        if members is not None:
            members.discard(snapshot.snapshot_id)
            if not members:
                del self._index[snapshot.key]
        self._pool.release(list(reversed(snapshot.page_ids)))
        self._host.give(snapshot.host_slots)
        self._rows.give(snapshot.staging_rows)  # (none: it is dropped only once no restore reads it)
        snapshot.staging_rows = []
        if snapshot.tail is not None:
            pool = self._rows if snapshot.tail.kind == StorageKind.CONTINUATION else self._host
            pool.give([snapshot.tail.index])
        snapshot.page_ids, snapshot.host_slots, snapshot.tail = [], [], None

    # -- invariants ----------------------------------------------------------------------------

    def page_holders(self) -> list[int]:
        """Every page reference snapshots hold (pages and fenced pages), with repetition."""
        held = []
        for snapshot in self._snapshots.values():
            held.extend(snapshot.page_ids)
            held.extend(snapshot.fenced_pages)
        return held

    def check(self) -> None:
        """Every continuation row and host slot is free or owned by exactly one snapshot."""
        rows: list[int] = []
        slots: list[int] = []
        for snapshot in self._snapshots.values():
            slots.extend(snapshot.host_slots)
            slots.extend(snapshot.pending_slots)
            rows.extend(snapshot.staging_rows)
            if snapshot.tail is not None:
                (rows if snapshot.tail.kind == StorageKind.CONTINUATION else slots).append(snapshot.tail.index)
            require(not snapshot.doomed or snapshot.is_busy, f"snapshot {snapshot.snapshot_id} doomed but kept")
        for name, owned, pool in (("row", rows, self._rows), ("host slot", slots, self._host)):
            free = pool.free_ids()
            require(len(owned) == len(set(owned)), f"a {name} is owned twice")
            require(not free & set(owned), f"a {name} is both free and owned")
            require(len(free) + len(owned) == pool.size, f"a {name} leaked")


def _page(page: int) -> Location:
    return Location(StorageKind.PAGE, page)
