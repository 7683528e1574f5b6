"""HistoryStorage: the byte moves of snapshot capture, offload and restore, on real tensors."""

from __future__ import annotations

import pytest
import torch

from helios.runtime.records.capacities import HistoryKind, HistoryRegion, StorageLayout
from helios.runtime.execution.history_storage import HistoryStorage, Plane, UnsupportedCopyError
from helios.runtime.cache.page_pool import PagePool
from helios.runtime.cache.pages import PageAllocator
from helios.runtime.cache.prefix_cache import PrefixCache
from helios.runtime.records.plan import CopyOp, Location, StorageKind
from helios.runtime.cache.snapshots import FenceKind, Residence, SnapshotStore

PAGE_TOKENS, PAGES, SLOTS, ROWS = 4, 6, 3, 2  # ROWS: state rows per request


def storage(continuation_rows=2, host_slots=4):
    kv = Plane(torch.randn(2, PAGES, PAGE_TOKENS, 3), 1)  # [layers, pages, page_tokens, width]
    conv = Plane(torch.randn(2, SLOTS * ROWS, 5), 1)  # [layers, state rows, width]
    ssm = Plane(torch.randn(SLOTS * ROWS, 2, 2), 0)  # state rows first
    return HistoryStorage([kv], [conv, ssm], ROWS, continuation_rows, host_slots)


def state_of(store: HistoryStorage, slot: int) -> list[torch.Tensor]:
    _, planes = store.planes(StorageKind.STATE)
    return [p.tensor.narrow(p.dim, slot * ROWS, ROWS).clone() for p in planes]


def page_of(store: HistoryStorage, page: int) -> torch.Tensor:
    (kv,), _ = store.planes(StorageKind.PAGE)
    return kv.tensor[:, page].clone()


def test_capture_and_restore_through_a_continuation_row():
    store = storage()
    saved_state, saved_page = state_of(store, 1), page_of(store, 2)
    loc = Location
    store.copy(CopyOp(loc(StorageKind.PAGE, 2), loc(StorageKind.CONTINUATION, 1), 3))  # partial page
    store.copy(CopyOp(loc(StorageKind.STATE, 1), loc(StorageKind.CONTINUATION, 1), 0))  # the slot's state
    store.copy(CopyOp(loc(StorageKind.CONTINUATION, 1), loc(StorageKind.STATE, 0), 0))
    store.copy(CopyOp(loc(StorageKind.CONTINUATION, 1), loc(StorageKind.PAGE, 5), 3))
    for restored, saved in zip(state_of(store, 0), saved_state):
        assert torch.equal(restored, saved)
    assert torch.equal(page_of(store, 5)[:, :3], saved_page[:, :3])
    assert not torch.equal(page_of(store, 5)[:, 3], saved_page[:, 3])  # only the partial tokens moved
    assert all(torch.equal(a, b) for a, b in zip(state_of(store, 1), saved_state))  # source untouched


def test_offload_moves_page_and_state_of_a_tail_in_one_copy():
    store = storage()
    loc = Location
    saved_state, saved_page = state_of(store, 2), page_of(store, 0)
    store.copy(CopyOp(loc(StorageKind.PAGE, 0), loc(StorageKind.CONTINUATION, 0), 2))
    store.copy(CopyOp(loc(StorageKind.STATE, 2), loc(StorageKind.CONTINUATION, 0), 0))
    store.copy(CopyOp(loc(StorageKind.CONTINUATION, 0), loc(StorageKind.HOST, 3), 2))  # offload: both parts
    store.copy(CopyOp(loc(StorageKind.HOST, 3), loc(StorageKind.STATE, 1), 0))
    store.copy(CopyOp(loc(StorageKind.HOST, 3), loc(StorageKind.PAGE, 4), 2))
    assert all(torch.equal(a, b) for a, b in zip(state_of(store, 1), saved_state))
    assert torch.equal(page_of(store, 4)[:, :2], saved_page[:, :2])
    host_pages, host_state = store.planes(StorageKind.HOST)
    assert all(p.tensor.device.type == "cpu" for p in host_pages + host_state)


@pytest.mark.parametrize("copy, message", [
    (CopyOp(Location(StorageKind.STATE, SLOTS), Location(StorageKind.CONTINUATION, 0), 0), "outside"),
    (CopyOp(Location(StorageKind.PAGE, 0), Location(StorageKind.CONTINUATION, 2), 1), "outside"),
    (CopyOp(Location(StorageKind.HOST, -1), Location(StorageKind.PAGE, 0), 1), "outside"),
    (CopyOp(Location(StorageKind.PAGE, 0), Location(StorageKind.STATE, 0), 4), "moves nothing"),
    (CopyOp(Location(StorageKind.UNSPECIFIED, 0), Location(StorageKind.PAGE, 0), 4), "no storage"),
])
def test_bad_copies_are_refused(copy, message):
    with pytest.raises(UnsupportedCopyError, match=message):
        storage().copy(copy)


def test_snapshot_store_copies_round_trip_through_real_storage():
    """The copies SnapshotStore plans for a recurrent layout rebuild a slot's state and tail exactly."""
    layout = StorageLayout(PAGE_TOKENS, (HistoryRegion("kv", HistoryKind.PAGED_KV),
                                         HistoryRegion("ssm", HistoryKind.RECURRENT)))
    pool = PagePool(PageAllocator(PAGES), PrefixCache())
    snapshots = SnapshotStore(pool, layout, num_rows=2, num_host_slots=4)
    store = storage()
    pages = pool.allocate(2)
    saved_state, saved_tail = state_of(store, 0), page_of(store, pages[1])
    tokens = tuple(range(6))  # one complete page and 2 tokens of the second
    snapshot, copies = snapshots.capture(tokens, b"k", pages, state_slot=0, owner=None, residence=Residence.DEVICE)
    for copy in copies:
        store.copy(copy)
    snapshots.settle(snapshot.snapshot_id, FenceKind.CAPTURE, ok=True)
    private = pool.allocate(1)
    snapshots.hold(snapshot)
    for copy in snapshots.restore_copies(snapshot, 0, private, state_slot=2):
        store.copy(copy)
    snapshots.settle(snapshot.snapshot_id, FenceKind.RESTORE, ok=True)
    assert all(torch.equal(a, b) for a, b in zip(state_of(store, 2), saved_state))
    assert torch.equal(page_of(store, private[0])[:, :2], saved_tail[:, :2])
    snapshots.check()


def test_compressed_planes_copy_the_records_covering_the_tokens():
    latent = Plane(torch.randn(1, PAGES, PAGE_TOKENS // 2, 3), 1, tokens_per_record=2)  # 2 records a page
    store = HistoryStorage([latent], [], 1, continuation_rows=1, host_slots=1)
    (cont,), _ = store.planes(StorageKind.CONTINUATION)
    store.copy(CopyOp(Location(StorageKind.PAGE, 3), Location(StorageKind.CONTINUATION, 0), 3))  # 3 tokens
    assert torch.equal(cont.tensor[:, 0], latent.tensor[:, 3])  # both records: the second is partial
    store.copy(CopyOp(Location(StorageKind.PAGE, 1), Location(StorageKind.CONTINUATION, 0), 1))
    assert torch.equal(cont.tensor[:, 0, 0], latent.tensor[:, 1, 0])
    assert torch.equal(cont.tensor[:, 0, 1], latent.tensor[:, 3, 1])  # the record past 1 token is kept
