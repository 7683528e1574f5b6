"""Snapshot bookkeeping: capture, publish, restore, offload, eviction, failure."""

from __future__ import annotations

from helios.runtime.records.capacities import HistoryKind, HistoryRegion, StorageLayout
from helios.runtime.cache.page_pool import PagePool
from helios.runtime.cache.pages import PageAllocator
from helios.runtime.records.plan import CopyOp, Location, StorageKind
from helios.runtime.cache.prefix_cache import PrefixCache, extend_chain, root_digest
from helios.runtime.cache.snapshots import FenceKind, Residence, SnapshotStore

ROOT = root_digest(b"m")
PAGE, CONT, HOST, STATE = StorageKind.PAGE, StorageKind.CONTINUATION, StorageKind.HOST, StorageKind.STATE


def store(rows=2, host=8, num_pages=8, stateful=False, programs=False):
    regions = (HistoryRegion("kv", HistoryKind.PAGED_KV),)
    if stateful:
        regions += (HistoryRegion("ssm", HistoryKind.RECURRENT),)
    pool = PagePool(PageAllocator(num_pages), PrefixCache())
    return pool, SnapshotStore(pool, StorageLayout(4, regions, restores_through_programs=programs), rows, host)


def chain_of(tokens):
    chain: list[bytes] = []
    extend_chain(chain, ROOT, tokens, 4, len(tokens) // 4)
    return chain


def capture(snapshots, pool, tokens, residence=Residence.DEVICE, owner=None, slot=3):
    pages = pool.allocate(-(-len(tokens) // 4))
    chain = chain_of(tokens)
    key = chain[-1] if chain else ROOT
    return pages, snapshots.capture(tuple(tokens), key, pages, slot, owner, residence)


def test_device_capture_publishes_only_after_its_fence():
    pool, snapshots = store()
    tokens = list(range(10))
    pages, (snapshot, copies) = capture(snapshots, pool, tokens)
    assert pages == [0, 1, 2]
    assert copies == [CopyOp(Location(PAGE, 2), Location(CONT, 0), 2)]
    assert snapshot.page_ids == [0, 1] and snapshot.fenced_pages == [2] and snapshot.tail == Location(CONT, 0)
    probe = tokens + [77, 78]
    assert snapshots.find(probe, chain_of(probe), ROOT) is None  # still being written
    snapshots.settle(snapshot.snapshot_id, FenceKind.CAPTURE, True)
    assert snapshot.ready and snapshot.fenced_pages == []
    assert [pool.allocator.ref_count(p) for p in pages] == [1, 1, 0] and pool.allocator.is_free(2)
    assert snapshots.find(probe, chain_of(probe), ROOT) is snapshot
    assert snapshots.find(tokens, chain_of(tokens), ROOT) is None  # endpoint must leave a token
    other = tokens[:9] + [99, 1, 2]
    assert snapshots.find(other, chain_of(other), ROOT) is None
    assert snapshots.num_published == 1
    snapshots.check()


def test_failed_capture_never_publishes():
    pool, snapshots = store()
    pages, (snapshot, _) = capture(snapshots, pool, list(range(6)))
    snapshots.settle(snapshot.snapshot_id, FenceKind.CAPTURE, False)
    assert snapshots.get(snapshot.snapshot_id) is None and snapshots.num_published == 0
    assert all(pool.allocator.is_free(p) for p in pages)
    snapshots.check()


def test_restore_copies_tail_into_private_page_and_shares_complete_pages():
    pool, snapshots = store()
    _, (snapshot, _) = capture(snapshots, pool, list(range(10)))
    snapshots.settle(snapshot.snapshot_id, FenceKind.CAPTURE, True)
    snapshots.hold(snapshot)
    copies = snapshots.restore_copies(snapshot, 0, [6], slot := 1)
    assert copies == [CopyOp(Location(CONT, 0), Location(PAGE, 6), 2)] and slot == 1
    assert not snapshots.drop_lru_device()  # held while the restore reads it
    snapshots.settle(snapshot.snapshot_id, FenceKind.RESTORE, True)
    assert snapshots.drop_lru_device() and snapshots.get(snapshot.snapshot_id) is None
    assert pool.num_available == 8
    snapshots.check()


def test_offload_moves_pages_to_host_after_the_fence_and_restores_from_there():
    pool, snapshots = store()
    pages, (snapshot, _) = capture(snapshots, pool, list(range(9)))
    snapshots.settle(snapshot.snapshot_id, FenceKind.CAPTURE, True)
    assert snapshots.offload_candidate() is snapshot
    copies = snapshots.offload(snapshot)
    assert copies == [CopyOp(Location(PAGE, 0), Location(HOST, 0), 4), CopyOp(Location(PAGE, 1), Location(HOST, 1), 4),
                      CopyOp(Location(CONT, 0), Location(HOST, 2), 1)]
    assert pool.allocator.ref_count(0) == 1  # still on the device until the copies complete
    snapshots.settle(snapshot.snapshot_id, FenceKind.OFFLOAD, True)
    assert snapshot.residence == Residence.HOST and snapshot.host_slots == [0, 1]
    assert snapshot.tail == Location(HOST, 2) and pool.num_available == 8
    probe = list(range(9)) + [5]
    assert snapshots.find(probe, chain_of(probe), ROOT) is snapshot
    restore = snapshots.restore_copies(snapshot, 1, [5, 6], 0)  # page 0 came from the prefix cache
    assert restore == [CopyOp(Location(HOST, 1), Location(PAGE, 5), 4), CopyOp(Location(HOST, 2), Location(PAGE, 6), 1)]
    assert snapshots.num_offloaded == 1
    snapshots.check()


def test_failed_offload_keeps_the_device_copy():
    pool, snapshots = store()
    _, (snapshot, _) = capture(snapshots, pool, list(range(5)))
    snapshots.settle(snapshot.snapshot_id, FenceKind.CAPTURE, True)
    snapshots.offload(snapshot)
    snapshots.settle(snapshot.snapshot_id, FenceKind.OFFLOAD, False)
    assert snapshot.residence == Residence.DEVICE and snapshot.page_ids == [0] and snapshot.ready
    snapshots.check()


def test_rows_are_reclaimed_from_the_least_recently_used_snapshot():
    pool, snapshots = store(rows=2)
    made = []
    for start in (0, 20, 40):
        _, (snapshot, _) = capture(snapshots, pool, list(range(start, start + 3)))
        snapshots.settle(snapshot.snapshot_id, FenceKind.CAPTURE, True)
        made.append(snapshot)
    assert snapshots.get(made[0].snapshot_id) is None and snapshots.num_evicted == 1
    assert made[2].tail == Location(CONT, 0)  # the row the oldest snapshot gave back
    snapshots.hold(made[1])
    snapshots.restore_copies(made[1], 0, [7], 0)  # a restore makes it most recently used
    snapshots.settle(made[1].snapshot_id, FenceKind.RESTORE, True)
    _, (fourth, _) = capture(snapshots, pool, list(range(60, 63)))
    assert snapshots.get(made[2].snapshot_id) is None and snapshots.get(made[1].snapshot_id) is made[1]
    assert fourth.tail == Location(CONT, 0)
    snapshots.check()


def test_private_host_capture_is_consumed_by_its_restore():
    pool, snapshots = store()
    pages, (snapshot, copies) = capture(snapshots, pool, list(range(6)), Residence.HOST, owner="r1")
    assert copies == [CopyOp(Location(PAGE, 0), Location(HOST, 0), 4), CopyOp(Location(PAGE, 1), Location(HOST, 1), 2)]
    assert snapshot.fenced_pages == pages and snapshot.page_ids == []
    snapshots.settle(snapshot.snapshot_id, FenceKind.CAPTURE, True)
    assert pool.num_available == 8
    probe = list(range(6)) + [1]
    assert snapshots.find(probe, chain_of(probe), ROOT) is None  # private snapshots are not shared
    snapshots.hold(snapshot)
    snapshots.restore_copies(snapshot, 0, [3, 4], 2)
    snapshots.settle(snapshot.snapshot_id, FenceKind.RESTORE, True)
    assert snapshots.get(snapshot.snapshot_id) is None
    snapshots.check()


def test_state_layouts_carry_slot_state_even_at_page_boundaries():
    pool, snapshots = store(stateful=True)
    assert snapshots.needs_tail(8)
    _, (snapshot, copies) = capture(snapshots, pool, list(range(8)), slot=5)
    assert copies == [CopyOp(Location(STATE, 5), Location(CONT, 0), 0)]
    snapshots.settle(snapshot.snapshot_id, FenceKind.CAPTURE, True)
    snapshots.hold(snapshot)
    assert snapshots.restore_copies(snapshot, 0, [], 2) == [CopyOp(Location(CONT, 0), Location(STATE, 2), 0)]


def test_a_published_state_is_known_from_its_capture_until_it_is_dropped():
    """`is_published` answers for a published capture still being written (another request reaching
    the same state then captures nothing), never for a private one, a failed one or another state."""
    pool, snapshots = store(rows=4, host=8)
    tokens = list(range(10))
    key = chain_of(tokens)[-1]
    _, (snapshot, _) = capture(snapshots, pool, tokens)
    assert snapshots.is_published(tokens, key)  # being captured
    assert not snapshots.is_published(tokens[:9], chain_of(tokens[:9])[-1])
    probe = tokens + [77]
    assert snapshots.find(probe, chain_of(probe), ROOT) is None  # lookups still wait for its fence
    snapshots.settle(snapshot.snapshot_id, FenceKind.CAPTURE, False)
    assert not snapshots.is_published(tokens, key)  # a failed capture publishes nothing
    _, (private, _) = capture(snapshots, pool, tokens, Residence.HOST, owner="preempted")
    assert not snapshots.is_published(tokens, key)
    _, (published, _) = capture(snapshots, pool, tokens)
    snapshots.settle(published.snapshot_id, FenceKind.CAPTURE, True)
    assert snapshots.is_published(tokens, key) and snapshots.num_published == 1
    snapshots.discard(private.snapshot_id)
    snapshots.check()


def test_an_offloaded_state_tail_is_restored_through_a_continuation_row():
    """The state in an offloaded tail is the core's snapshot-row form (its SNAPSHOT program wrote
    it): it goes back into a continuation row, and the slot's state rows are restored from there
    (through the core's RESTORATION program), not from the host slot."""
    pool, snapshots = store(rows=2, stateful=True, programs=True)
    _, (snapshot, _) = capture(snapshots, pool, list(range(10)))
    snapshots.settle(snapshot.snapshot_id, FenceKind.CAPTURE, True)
    snapshots.offload(snapshot)
    snapshots.settle(snapshot.snapshot_id, FenceKind.OFFLOAD, True)
    assert snapshot.tail == Location(HOST, 2)
    snapshots.check()
    snapshots.hold(snapshot)
    copies = snapshots.restore_copies(snapshot, 0, [5, 6, 7], 1)
    row = copies[2].dst.index
    staged = Location(CONT, row)
    assert copies == [CopyOp(Location(HOST, 0), Location(PAGE, 5), 4), CopyOp(Location(HOST, 1), Location(PAGE, 6), 4),
                      CopyOp(Location(HOST, 2), staged, 2), CopyOp(staged, Location(PAGE, 7), 2),
                      CopyOp(staged, Location(STATE, 1), 0)]
    assert snapshot.staging_rows == [row]
    snapshots.check()  # the row is the snapshot's while its restore is in flight
    _, (other, _) = capture(snapshots, pool, list(range(20, 23)))
    assert other.tail != Location(CONT, row)
    snapshots.settle(snapshot.snapshot_id, FenceKind.RESTORE, True)
    assert snapshot.staging_rows == [] and snapshots.num_restored == 1
    snapshots.check()  # and free again once it settled


def test_a_preempted_requests_state_goes_to_the_host_through_a_continuation_row():
    """A private (preemption) capture on a core with state programs keeps an offloaded snapshot's
    contract: the slot's state rows go into a continuation row (the core's SNAPSHOT program) and
    from there to the host tail, and come back through a continuation row (its RESTORATION
    program), never raw; the capture's row is free again once it settles. Without a row to be had
    the capture fails (the caller recomputes the request) and takes no host slot."""
    pool, snapshots = store(rows=1, stateful=True, programs=True)
    _, (snapshot, copies) = capture(snapshots, pool, list(range(6)), Residence.HOST, owner="r1", slot=2)
    row, tail = Location(CONT, 0), Location(HOST, 1)
    assert copies == [CopyOp(Location(PAGE, 0), Location(HOST, 0), 4), CopyOp(Location(PAGE, 1), tail, 2),
                      CopyOp(Location(STATE, 2), row, 0), CopyOp(row, tail, 0)]
    assert snapshot.staging_rows == [0]
    snapshots.check()
    pages, refused = capture(snapshots, pool, list(range(20, 26)), Residence.HOST, owner="r2", slot=1)
    assert refused is None  # the one row is the first capture's until it settles
    pool.release(pages)
    snapshots.settle(snapshot.snapshot_id, FenceKind.CAPTURE, True)
    assert snapshot.staging_rows == [] and snapshot.tail == tail
    snapshots.check()
    snapshots.hold(snapshot)
    assert snapshots.can_restore(snapshot)
    assert snapshots.restore_copies(snapshot, 0, [3, 4], 0) == [
        CopyOp(Location(HOST, 0), Location(PAGE, 3), 4), CopyOp(tail, row, 2), CopyOp(row, Location(PAGE, 4), 2),
        CopyOp(row, Location(STATE, 0), 0)]
    snapshots.settle(snapshot.snapshot_id, FenceKind.RESTORE, True)
    assert snapshots.get(snapshot.snapshot_id) is None  # consumed, its row and slots free again
    snapshots.check()
    _, (failed, _) = capture(snapshots, pool, list(range(30, 36)), Residence.HOST, owner="r4", slot=1)
    snapshots.settle(failed.snapshot_id, FenceKind.CAPTURE, False)  # its plan failed: dropped, nothing kept
    assert snapshots.get(failed.snapshot_id) is None and failed.staging_rows == []
    snapshots.check()
    raw_pool, without = store(rows=1, stateful=True)  # no state programs: straight to the host and back
    _, (raw, raw_copies) = capture(without, raw_pool, list(range(6)), Residence.HOST, owner="r3", slot=2)
    assert raw_copies[-1] == CopyOp(Location(STATE, 2), raw.tail, 0) and raw.staging_rows == []


def test_a_preemption_capture_that_cannot_have_both_a_row_and_host_slots_evicts_nothing():
    """A staged private capture needs a continuation row and host slots; when either cannot be had
    (even by eviction) it fails, and the published snapshots that held the other kind stay: an
    offloaded one whose slots it would have taken while every row is busy, and an idle device one
    whose row it would have taken while host slots are short. They were evicted for nothing."""
    pool, snapshots = store(rows=1, host=4, num_pages=12, stateful=True, programs=True)
    on_host = offloaded(snapshots, pool, list(range(10)))  # 3 of the 4 host slots
    _, (writing, _) = capture(snapshots, pool, list(range(20, 23)))  # takes the one row, still writing
    pages, refused = capture(snapshots, pool, list(range(30, 36)), Residence.HOST, owner="r1", slot=1)
    assert refused is None
    pool.release(pages)
    assert snapshots.get(on_host.snapshot_id) is on_host and snapshots.num_evicted == 0
    snapshots.check()
    snapshots.settle(writing.snapshot_id, FenceKind.CAPTURE, True)  # now an idle device snapshot holds the row
    pages, refused = capture(snapshots, pool, list(range(40, 57)), Residence.HOST, owner="r2", slot=1)
    assert refused is None  # 5 host slots: more than the pool has
    pool.release(pages)
    assert snapshots.get(writing.snapshot_id) is writing and snapshots.get(on_host.snapshot_id) is on_host
    assert snapshots.num_evicted == 0
    snapshots.check()
    _, (staged, _) = capture(snapshots, pool, list(range(30, 36)), Residence.HOST, owner="r1", slot=1)
    assert staged.staging_rows == [0] and snapshots.num_evicted == 2  # both can be had: both evicted
    snapshots.check()


def offloaded(snapshots, pool, tokens):
    _, (snapshot, _) = capture(snapshots, pool, tokens)
    snapshots.settle(snapshot.snapshot_id, FenceKind.CAPTURE, True)
    snapshots.offload(snapshot)
    snapshots.settle(snapshot.snapshot_id, FenceKind.OFFLOAD, True)
    return snapshot


def test_an_offloaded_tail_waits_for_a_continuation_row_on_a_core_with_state_programs():
    """While every continuation row is held (a capture still writing, restores in flight), an
    offloaded snapshot of a core with state programs cannot be restored (`can_restore`: the cache
    manager computes the prefix instead): its state would reach the slot raw, past the RESTORATION
    program, as it did when the staging fell back to the host tail."""
    pool, snapshots = store(rows=1, stateful=True, programs=True)
    snapshot = offloaded(snapshots, pool, list(range(10)))
    assert snapshots.can_restore(snapshot)
    _, (writing, _) = capture(snapshots, pool, list(range(20, 23)))  # takes the one row, still writing
    assert writing.tail == Location(CONT, 0) and not snapshots.can_restore(snapshot)
    snapshots.settle(writing.snapshot_id, FenceKind.CAPTURE, True)
    assert snapshots.can_restore(snapshot)  # an idle published device snapshot is evicted for it
    snapshots.hold(snapshot)
    copies = snapshots.restore_copies(snapshot, 0, [5, 6, 7], 1)
    assert copies[2] == CopyOp(Location(HOST, 2), Location(CONT, 0), 2) and snapshots.num_evicted == 1


def test_an_offloaded_tail_of_a_core_without_state_programs_goes_straight_back():
    """Without state programs a continuation row holds the slot's state rows raw: no staging row
    (an extra copy, and an idle device snapshot evicted for it), and no wait for one."""
    pool, snapshots = store(rows=1, stateful=True)
    snapshot = offloaded(snapshots, pool, list(range(10)))
    _, (kept, _) = capture(snapshots, pool, list(range(20, 23)))
    snapshots.settle(kept.snapshot_id, FenceKind.CAPTURE, True)
    assert snapshots.can_restore(snapshot)
    snapshots.hold(snapshot)
    copies = snapshots.restore_copies(snapshot, 0, [5, 6, 7], 1)
    assert copies[2:] == [CopyOp(Location(HOST, 2), Location(PAGE, 7), 2), CopyOp(Location(HOST, 2), Location(STATE, 1), 0)]
    assert snapshots.num_evicted == 0 and snapshots.get(kept.snapshot_id) is kept
