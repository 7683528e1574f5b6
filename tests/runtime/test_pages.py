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
    assert allocator.free_pages() == [3, 1, 0]  # freed pages are reused last
    assert allocator.allocate(1) == [3]


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
    assert pool.allocator.free_pages() == [5, 3, 4]
    assert pool.num_available == 6
    assert pool.allocate(5) == [5, 3, 4, 2, 1]  # free pages first, then the LRU tail pages
    assert pool.num_evicted == 2
    assert pool.cache.lookup([bytes([0]), bytes([1])]) == [0]
    assert pool.share([bytes([0])]) == [0]
    assert pool.allocator.ref_count(0) == 1 and pool.cache.num_parked == 0
    assert pool.allocate(1) is None
