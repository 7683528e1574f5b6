"""Page allocator, prefix cache and page pool: exact state."""

from __future__ import annotations

import pytest

from helios.runtime.records.faults import PageAccountingError
from helios.runtime.cache.page_pool import PagePool
from helios.runtime.cache.pages import PageAllocator
from helios.runtime.cache.prefix_cache import PrefixCache, extend_chain, page_digest, root_digest


def test_allocate_is_all_or_nothing_and_counts_references():
    allocator = PageAllocator(4)
    assert allocator.allocate(3) == [0, 1, 2]
    assert [allocator.ref_count(p) for p in range(4)] == [1, 1, 1, 0]
    assert allocator.allocate(2) is None
    assert allocator.free_pages() == [3]
    allocator.retain([1])
    assert allocator.release([0, 1, 1]) == [0, 1]
    allocator.free([1, 0])
    assert allocator.free_pages() == [0, 1, 3]
    assert allocator.allocate(1) == [3]  # next-fit: the search starts after the last allocation
    assert allocator.allocate(1) == [0]  # and wraps around to the freed pages


def test_allocator_rejects_bad_accounting():
    allocator = PageAllocator(2)
    with pytest.raises(PageAccountingError):
        allocator.retain([0])
    with pytest.raises(PageAccountingError):
        allocator.release([1])
    page, = allocator.allocate(1)
    with pytest.raises(PageAccountingError):
        allocator.free([page])


def test_digest_chain_covers_parent_tokens_and_salt():
    root = root_digest(b"model", b"")
    tokens = list(range(10))
    chain: list[bytes] = []
    extend_chain(chain, root, tokens, 4, len(tokens) // 4)
    assert len(chain) == 2  # the partial third page is never digested
    assert chain[0] == page_digest(root, [0, 1, 2, 3])
    assert chain[1] == page_digest(chain[0], [4, 5, 6, 7])
    changed: list[bytes] = []
    extend_chain(changed, root, [9] + tokens[1:], 4, 2)
    assert changed[0] != chain[0] and changed[1] != chain[1]  # page 1 inherits page 0's change
    for other in (root_digest(b"model", b"tenant"), root_digest(b"other", b"")):
        salted: list[bytes] = []
        extend_chain(salted, other, tokens, 4, 2)
        assert salted[0] != chain[0]
    assert root_digest(b"ab", b"c") != root_digest(b"a", b"bc")


def test_extending_a_chain_digests_each_page_after_its_parent():
    root = root_digest(b"model", b"")
    tokens = [(i * 7919) % 50000 for i in range(70)]
    expected = [page_digest(root, tokens[:8])]
    for index in range(1, 8):
        expected.append(page_digest(expected[-1], tokens[index * 8:index * 8 + 8]))
    whole: list[bytes] = []
    extend_chain(whole, root, tokens, 8, 8)
    resumed = expected[:3]
    extend_chain(resumed, root, tuple(tokens), 8, 8)  # a resumed chain, tuple ids
    assert whole == expected and resumed == expected
    extend_chain(resumed, root, tokens, 8, 5)  # covered already: unchanged
    assert resumed == expected


def test_prefix_cache_lookup_insert_and_lru_eviction():
    cache = PrefixCache()
    assert cache.insert(b"a", 5) and cache.insert(b"b", 6)
    assert not cache.insert(b"a", 7) and not cache.insert(b"c", 5)
    assert cache.lookup([b"a", b"b", b"x", b"a"]) == [5, 6]
    assert cache.lookup([b"x", b"a"]) == []
    cache.park(6)
    cache.park(5)
    assert cache.evict(3) is None
    assert cache.evict(1) == [6] and cache.lookup([b"a", b"b"]) == [5]
    assert cache.unpark(5) and not cache.unpark(5)
    assert cache.num_parked == 0
    cache.check()


def test_pool_parks_cached_pages_tail_first_and_evicts_lru():
    pool = PagePool(PageAllocator(6), PrefixCache())
    pages = pool.allocate(3)
    assert pages == [0, 1, 2]
    for index, page in enumerate(pages):
        pool.publish(bytes([index]), page)
    scratch = pool.allocate(2)
    pool.release(list(reversed(pages)))  # a finished request: tails first
    pool.release(scratch)  # uncached pages go straight to the free list
    assert pool.cache.parked_pages() == [2, 1, 0]
    assert pool.allocator.free_pages() == [3, 4, 5]
    assert pool.num_available == 6
    assert pool.allocate(5) == [1, 2, 3, 4, 5]  # free pages and the LRU tail pages 2, 1: one run
    assert pool.num_evicted == 2
    assert pool.cache.lookup([bytes([0]), bytes([1])]) == [0]
    assert pool.share([bytes([0])]) == [0]
    assert pool.allocator.ref_count(0) == 1 and pool.cache.num_parked == 0
    assert pool.allocate(1) is None


def test_several_pages_take_a_consecutive_run_from_the_last_allocation():
    allocator = PageAllocator(16)
    first = allocator.allocate(4)
    single = allocator.allocate(1)
    assert (first, single) == ([0, 1, 2, 3], [4])
    allocator.release(first)
    allocator.free(list(reversed(first)))  # freed tail first: the run is whole again
    assert allocator.allocate(3) == [5, 6, 7]  # next-fit: after the last allocation, not the freed hole
    assert allocator.allocate(8) == [8, 9, 10, 11, 12, 13, 14, 15]
    assert allocator.allocate(4) == [0, 1, 2, 3]  # wrapped around to the freed run
    assert allocator.num_free == 0 and allocator.allocate(1) is None


def test_a_run_straddling_the_cursor_is_found_after_wrapping():
    allocator = PageAllocator(8)
    pages = allocator.allocate(8)
    allocator.release(pages)
    allocator.free([2, 3, 4, 5])
    assert allocator.allocate(1) == [2]  # the cursor moves to 3
    allocator.free(allocator.release([2]))
    assert allocator.allocate(4) == [2, 3, 4, 5]


def test_follow_extends_a_table_when_the_next_ids_are_free():
    allocator = PageAllocator(12)
    row = allocator.allocate(3)
    other = allocator.allocate(2)  # another table's pages right after the row's
    assert (row, other) == ([0, 1, 2], [3, 4])
    assert allocator.allocate(2, follow=other[-1]) == [5, 6]
    assert allocator.allocate(2, follow=row[-1]) == [7, 8]  # pages 3, 4 are taken: the next run instead
    allocator.free(allocator.release([5, 6]))
    assert allocator.allocate(1, follow=4) == [5]  # behind the cursor (at 9), but after the table
    assert allocator.allocate(2, follow=10) == [9, 10]  # 11 and past the end: no follow, a run
    assert allocator.allocate(2, follow=5) == [11, 6]  # 7 is taken, no run: from the cursor, wrapping


def test_fragmented_pages_fall_back_to_the_first_free_ids_in_order():
    allocator = PageAllocator(10)
    pages = allocator.allocate(10)
    allocator.release(pages)
    allocator.free([8, 1, 5, 3])  # no two free ids are consecutive
    assert allocator.allocate(3) == [1, 3, 5]  # the cursor wrapped to 0 after the whole pool
    allocator = PageAllocator(10)
    pages = allocator.allocate(9)  # the cursor sits at page 9
    allocator.release(pages)
    allocator.free([7, 1, 5, 3])
    assert allocator.allocate(3) == [9, 1, 3]  # from the cursor, wrapping, ascending
    assert allocator.allocate(2) == [5, 7]
    assert allocator.num_free == 0 and allocator.free_pages() == []
    assert allocator.allocate(0) == []


def test_eviction_frees_parked_pages_before_the_run_is_searched():
    pool = PagePool(PageAllocator(8), PrefixCache())
    pages = pool.allocate(8)
    for index, page in enumerate(pages[:4]):
        pool.publish(bytes([index]), page)
    pool.release(list(reversed(pages)))  # pages 4-7 free, 0-3 parked (3 first: evicted first)
    held = pool.allocate(4)
    assert held == [4, 5, 6, 7] and pool.num_evicted == 0
    assert pool.allocate(2) == [2, 3]  # the two LRU parked pages, evicted, form a run
    assert pool.num_evicted == 2 and pool.cache.lookup([bytes([0]), bytes([1])]) == [0, 1]
