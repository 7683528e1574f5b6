"""The Triton kernels of helios::paged_attention and helios::cache_write against the CPU reference ops.

Without CUDA the kernels run under Triton's interpreter on CPU tensors: `enable_interpreter` sets
TRITON_INTERPRET=1 here, before triton is first imported (Triton reads it when kernels are
decorated), and it then holds for this process; no other test module imports triton on a machine
without CUDA. With CUDA the kernels run compiled and the reference runs on the CPU.

Every batch is built twice: clean for the reference, and poisoned for the kernels: each cache slot
outside the rows' contexts is NaN and page-table entries past a row's last page point at a NaN page,
so a kernel that reads anything it should not returns NaN. Padding tokens carry a far position.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch

ON_CUDA = torch.cuda.is_available()
if not ON_CUDA:
    from helios.abi.triton_interpret import enable_interpreter

    enable_interpreter()

from helios.abi import attention as _attention  # noqa: E402,F401  (registers the reference ops)
from helios.abi import triton_attention as kernels  # noqa: E402

DEVICE = "cuda" if ON_CUDA else "cpu"
SCALE = 0.3
PADDING_POSITION = 1_000_000
TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=1e-2, atol=1e-2),
             torch.float16: dict(rtol=1e-2, atol=1e-2)}


@dataclass(frozen=True)
class Shape:
    num_kv_heads: int = 2
    group: int = 2
    head_dim: int = 32
    page_tokens: int = 8
    dtype: torch.dtype = torch.float32


@dataclass(frozen=True)
class Batch:
    """One packed step. `clean` and `poisoned` are (k_cache, v_cache, page_table) for the reference
    and for the kernels; they agree on every slot and page entry a row may read."""

    q: torch.Tensor
    clean: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    poisoned: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    query_start: torch.Tensor
    positions: torch.Tensor
    num_real_tokens: int


def make_batch(seed: int, query_lens: list[int], cached_lens: list[int], shape: Shape = Shape(),
               padding: int = 0) -> Batch:
    """Rows of `query_lens` new tokens after `cached_lens` cached ones, on shuffled pages."""
    generator = torch.Generator().manual_seed(seed)
    contexts = [cached + new for cached, new in zip(cached_lens, query_lens)]
    row_pages = [-(-context // shape.page_tokens) for context in contexts]
    num_pages = sum(row_pages) + 2  # the last page is the poison page, never a row's
    order = torch.randperm(num_pages - 1, generator=generator).tolist()
    cache_shape = (num_pages, shape.page_tokens, shape.num_kv_heads, shape.head_dim)
    k_cache = torch.randn(cache_shape, generator=generator).to(shape.dtype)
    v_cache = torch.randn(cache_shape, generator=generator).to(shape.dtype)
    clean_table = torch.randint(0, num_pages, (len(contexts), max(row_pages) + 1), generator=generator,
                                dtype=torch.int32)
    poisoned_table = torch.full_like(clean_table, num_pages - 1)
    live = torch.zeros(num_pages, shape.page_tokens, dtype=torch.bool)
    for row, context in enumerate(contexts):
        pages = torch.tensor([order.pop() for _ in range(row_pages[row])], dtype=torch.int32)
        clean_table[row, : len(pages)] = poisoned_table[row, : len(pages)] = pages
        slots = pages.long()[:, None] * shape.page_tokens + torch.arange(shape.page_tokens)
        live.view(-1)[slots.view(-1)[:context]] = True
    positions = [p for cached, new in zip(cached_lens, query_lens) for p in range(cached, cached + new)]
    num_tokens = len(positions) + padding
    q = torch.randn(num_tokens, shape.num_kv_heads * shape.group, shape.head_dim, generator=generator)
    return Batch(
        q.to(shape.dtype), (k_cache, v_cache, clean_table),
        (_poison(k_cache, live), _poison(v_cache, live), poisoned_table),
        torch.tensor([0] + query_lens, dtype=torch.int32).cumsum(0).to(torch.int32),
        torch.tensor(positions + [PADDING_POSITION] * padding, dtype=torch.int64), len(positions))


def _poison(cache: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    poisoned = cache.clone()
    poisoned[~live] = float("nan")
    return poisoned


def reference(batch: Batch, window: int) -> torch.Tensor:
    k_cache, v_cache, table = batch.clean
    return torch.ops.helios.paged_attention(batch.q, k_cache, v_cache, table, batch.query_start,
                                            batch.positions, SCALE, window)


def visible_rows(batch: Batch, window: int):
    """For each real token of `batch` and each query head: (token, head, keys, values), the keys and
    values (float64 [n, D]) of the positions the token sees (its row's context, within `window` when
    > 0), read from the clean caches through the page table: a direct formula's inputs."""
    k_cache, v_cache, table = batch.clean
    page_tokens, group = k_cache.shape[1], batch.q.shape[1] // k_cache.shape[2]
    bounds = batch.query_start.tolist()
    for row in range(len(bounds) - 1):
        for token in range(bounds[row], bounds[row + 1]):
            pos = int(batch.positions[token])
            cached = [c for c in range(pos + 1) if window <= 0 or pos - c < window]
            slots = torch.tensor([int(table[row, c // page_tokens]) * page_tokens + c % page_tokens for c in cached])
            for head in range(batch.q.shape[1]):
                keys = k_cache.view(-1, *k_cache.shape[2:])[slots, head // group].double()
                values = v_cache.view(-1, *v_cache.shape[2:])[slots, head // group].double()
                yield token, head, keys, values


def run(launcher, batch: Batch, window: int, **options) -> torch.Tensor:
    """Call a launcher on the poisoned batch on DEVICE; the result comes back on the CPU."""
    k_cache, v_cache, table = (t.to(DEVICE) for t in batch.poisoned)
    out = launcher(batch.q.to(DEVICE), k_cache, v_cache, table, batch.query_start.to(DEVICE),
                   batch.positions.to(DEVICE), SCALE, window, **options)
    return out.cpu()


def assert_matches_reference(out: torch.Tensor, batch: Batch, window: int) -> None:
    assert out.dtype == batch.q.dtype and out.shape == batch.q.shape
    assert torch.all(out[batch.num_real_tokens:] == 0)  # padding tokens: exactly zero
    torch.testing.assert_close(out, reference(batch, window), **TOLERANCE[batch.q.dtype])


# Decode: one token per row, ragged contexts; the op's dispatch picks the decode kernel (T == R).

DECODE_LENS, DECODE_CACHED = [1] * 5, [0, 6, 15, 22, 39]


@pytest.mark.parametrize("split", [1, 3, None])
def test_decode_ragged_contexts_with_and_without_split(split):
    batch = make_batch(1, DECODE_LENS, DECODE_CACHED)
    assert_matches_reference(run(kernels.triton_paged_attention, batch, 0, split=split), batch, 0)


def test_decode_sliding_window_across_splits():
    batch = make_batch(2, DECODE_LENS, DECODE_CACHED, Shape(page_tokens=4))
    assert_matches_reference(run(kernels.triton_paged_attention, batch, 5, split=4), batch, 5)


def test_decode_shaped_batch_with_a_multi_token_row_and_padding():
    """T <= R does not mean one token per row: here a row of 2, an inactive row, then padding."""
    batch = make_batch(3, [2, 0, 1, 0], [5, 3, 12, 1], padding=1)
    assert batch.q.shape[0] <= batch.query_start.shape[0] - 1
    assert_matches_reference(run(kernels.triton_paged_attention, batch, 0, split=2), batch, 0)


# Prefill and mixed batches: the general kernel.

MIXED_LENS, MIXED_CACHED = [5, 1, 0, 1, 19], [3, 10, 2, 0, 17]
SHORT_LENS = [4, 1, 0, 1, 3]  # MIXED with fewer tokens, for the one-program-per-token decode kernel


def test_prefill_chunks_over_cached_prefix_pages():
    batch = make_batch(4, [9, 6], [13, 0], Shape(page_tokens=4, head_dim=64))
    assert_matches_reference(run(kernels.triton_paged_attention, batch, 0), batch, 0)


@pytest.mark.parametrize("group", [1, 2, 4])
def test_mixed_batch_grouped_query_heads(group):
    batch = make_batch(5, MIXED_LENS, MIXED_CACHED, Shape(group=group, num_kv_heads=4 // group), padding=2)
    assert_matches_reference(run(kernels.triton_paged_attention, batch, 0), batch, 0)


@pytest.mark.parametrize("window", [1, 4])
def test_mixed_batch_sliding_window(window):
    batch = make_batch(6, MIXED_LENS, MIXED_CACHED, Shape(page_tokens=4), padding=1)
    assert_matches_reference(run(kernels.triton_paged_attention, batch, window), batch, window)


def release_below_window(batch: Batch, window: int) -> Batch:
    """The poisoned page tables with every page that lies wholly below each row's window pointing at
    the NaN page, as after the runtime released them (another request may own them now)."""
    k_cache, v_cache, table = batch.poisoned
    table, page_tokens, poison = table.clone(), k_cache.shape[1], k_cache.shape[0] - 1
    bounds = batch.query_start.tolist()
    for row in range(len(bounds) - 1):
        if bounds[row + 1] > bounds[row]:
            first_read = int(batch.positions[bounds[row]:bounds[row + 1]].min()) - window + 1
            table[row, :max(0, first_read) // page_tokens] = poison
    return replace(batch, poisoned=(k_cache, v_cache, table))


@pytest.mark.parametrize("window", [5, 9])
def test_pages_below_the_window_are_never_read(window):
    """Both kernels read nothing below a row's window, not even in a tile they mask: released
    pages may hold anything."""
    decode = release_below_window(make_batch(19, DECODE_LENS, DECODE_CACHED, Shape(page_tokens=4)), window)
    assert_matches_reference(run(kernels.triton_paged_attention, decode, window, split=2), decode, window)
    mixed = release_below_window(make_batch(20, MIXED_LENS, MIXED_CACHED, Shape(page_tokens=4), padding=1), window)
    assert_matches_reference(run(kernels.paged_attention_prefill, mixed, window), mixed, window)


@pytest.mark.parametrize("tile", [kernels.PrefillTile(16, 16, 2, 1), kernels.PrefillTile(128, 32, 8, 3)],
                         ids=["small", "wide"])
def test_every_prefill_tile_is_exact(tile):
    batch = make_batch(21, MIXED_LENS, MIXED_CACHED, Shape(group=4, num_kv_heads=1, page_tokens=4), padding=2)
    assert_matches_reference(run(kernels.paged_attention_prefill, batch, 0, tile=tile), batch, 0)
    assert_matches_reference(run(kernels.paged_attention_prefill, batch, 7, tile=tile), batch, 7)


@pytest.mark.parametrize("page_tokens", [1, 5])
def test_one_token_pages_and_pages_that_are_not_powers_of_two(page_tokens):
    batch = make_batch(16, SHORT_LENS, MIXED_CACHED, Shape(page_tokens=page_tokens), padding=1)
    assert_matches_reference(run(kernels.paged_attention_prefill, batch, 0), batch, 0)
    assert_matches_reference(run(kernels.paged_attention_decode, batch, 0, split=2), batch, 0)


def test_head_dim_and_group_that_are_not_powers_of_two():
    batch = make_batch(7, [4, 1, 7], [2, 9, 0], Shape(head_dim=96, group=3, num_kv_heads=1, page_tokens=16), padding=1)
    assert_matches_reference(run(kernels.triton_paged_attention, batch, 0), batch, 0)
    assert_matches_reference(run(kernels.paged_attention_decode, batch, 0, split=2), batch, 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_each_dtype_on_both_paths(dtype):
    batch = make_batch(8, MIXED_LENS, MIXED_CACHED, Shape(dtype=dtype, page_tokens=16), padding=1)
    assert_matches_reference(run(kernels.paged_attention_prefill, batch, 3), batch, 3)
    decode = make_batch(9, DECODE_LENS, DECODE_CACHED, Shape(dtype=dtype, page_tokens=16))
    assert_matches_reference(run(kernels.paged_attention_decode, decode, 0, split=2), decode, 0)


def test_each_kernel_is_exact_on_the_other_kernels_layouts():
    """The prefill kernel on one-token rows; the decode kernel (split) on multi-token rows."""
    decode = make_batch(10, DECODE_LENS, DECODE_CACHED, padding=2)
    assert_matches_reference(run(kernels.paged_attention_prefill, decode, 0), decode, 0)
    mixed = make_batch(11, SHORT_LENS, MIXED_CACHED, padding=1)
    assert_matches_reference(run(kernels.paged_attention_decode, mixed, 2, split=3), mixed, 2)


def test_strided_queries():
    batch = make_batch(12, [3, 1], [4, 8], padding=1)
    wide = torch.cat([batch.q, torch.randn_like(batch.q)], dim=1)[:, : batch.q.shape[1]]  # not contiguous
    strided = replace(batch, q=wide)
    assert not wide.is_contiguous()
    assert_matches_reference(run(kernels.triton_paged_attention, strided, 0), strided, 0)


def test_decode_splits_depend_on_shapes_only():
    cpu = torch.device("cpu")
    assert kernels.decode_splits(1, 8, 8192, cpu) > 1  # batch-1 decode fills the device
    assert kernels.decode_splits(1, 8, 64, cpu) == 1  # a short context is not cut
    assert kernels.decode_splits(256, 8, 8192, cpu) == 1  # a big batch fills the device alone
    assert kernels.decode_splits(1, 1, 1 << 20, cpu) <= 64


# Tuned decode: the split count comes from a device tensor (helios::paged_attention_tuned).

TUNED_LENS, TUNED_CACHED = [1, 1, 1], [5, 610, 1100]  # contexts long enough for several splits


@pytest.mark.parametrize("count", [0, 1, 2, 3, 5, 99])
def test_tuned_decode_reads_its_split_count_from_the_tensor(count):
    """Any count (clamped to [1, bound]) is only a schedule: every one gives the reference result."""
    batch = make_batch(17, TUNED_LENS, TUNED_CACHED, Shape(page_tokens=32))
    max_context = batch.poisoned[2].shape[1] * 32
    bound = kernels.tuned_split_bound(3, Shape().num_kv_heads, max_context)
    assert bound == 9 and kernels.grid_splits(max_context, bound, 64) == 9  # several splits in the grid
    splits = torch.tensor([count], dtype=torch.int32, device=DEVICE)
    out = run(kernels.triton_paged_attention_tuned, batch, 700, splits=splits)
    assert_matches_reference(out, batch, 700)


def test_tuned_prefill_path_ignores_the_split_count():
    batch = make_batch(18, [4, 1], [3, 9], padding=1)
    splits = torch.tensor([4], dtype=torch.int32, device=DEVICE)
    assert_matches_reference(run(kernels.triton_paged_attention_tuned, batch, 0, splits=splits), batch, 0)


def test_tuned_split_bound_depends_on_shapes_only():
    assert kernels.tuned_split_bound(1, 8, 4096) == 32  # one split per 128 positions of the capacity
    assert kernels.tuned_split_bound(1, 1, 1 << 20) == 64  # at most DECODE_MAX_SPLITS
    assert kernels.tuned_split_bound(256, 8, 8192) == 1  # a big batch fills any device alone
    assert kernels.tuned_split_bound(64, 8, 8192) == 1  # 2 programs per multiprocessor of a 256-SM device
    assert kernels.tuned_split_bound(16, 8, 8192) == 4


# Cache writes.

def test_cache_write_matches_reference_and_skips_negative_slots():
    generator = torch.Generator().manual_seed(13)
    k_cache = torch.randn(5, 4, 2, 32, generator=generator)
    v_cache = torch.randn(k_cache.shape, generator=generator)
    k = torch.randn(6, 2, 64, generator=generator)[..., :32]  # strided token rows
    v = torch.randn(6, 2, 32, generator=generator)
    slots = torch.tensor([17, -1, 0, 9, -5, 19])
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    torch.ops.helios.cache_write(expected_k, expected_v, k, v, slots)
    on_device = k_cache.to(DEVICE), v_cache.to(DEVICE)
    kernels.triton_cache_write(*on_device, k.to(DEVICE), v.to(DEVICE), slots.to(DEVICE))
    assert torch.equal(on_device[0].cpu(), expected_k) and torch.equal(on_device[1].cpu(), expected_v)
    assert torch.equal(expected_k.view(-1, 2, 32)[[17, 0, 9, 19]], k[[0, 2, 3, 5]])


# The compiler, stricter than the interpreter, accepts every kernel (PTX and ptxas, sm_90):
# test_kernels_compile_for_hopper (compile_attention_kernels.py, in one process with the other scripts).


def test_ops_have_cuda_kernels_registered():
    import helios.abi.tuning  # noqa: F401  (registers helios::device_multiprocessors)

    for op in ("helios::paged_attention", "helios::paged_attention_tuned", "helios::cache_write",
               "helios::device_multiprocessors"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "CUDA")


def token_slots(batch: Batch) -> torch.Tensor:
    """Flat cache slot of each packed token's own position (-1 for padding)."""
    table, page_tokens = batch.clean[2], batch.clean[0].shape[1]
    lens = batch.query_start.diff()
    rows = torch.repeat_interleave(torch.arange(len(lens)), lens)
    positions = batch.positions[: batch.num_real_tokens]
    slots = table[rows, positions // page_tokens].long() * page_tokens + positions % page_tokens
    return torch.cat([slots, torch.full((len(batch.positions) - len(slots),), -1)])


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens, first_lens, second_lens",
                         [(6, [3, 1, 1, 0], [1, 2, 1, 1]), (4, [1, 1, 1, 0], [1, 1, 1, 1])], ids=["prefill", "decode"])
def test_cuda_ops_replay_in_a_cuda_graph_with_new_step_data(num_tokens, first_lens, second_lens):
    """Capture write-then-attend once; replay it with another step's keys, slots, tables and positions.
    The second step's own keys and values are NaN in the cache until the captured write puts them."""
    first = make_batch(14, first_lens, [5, 20, 2, 4], padding=num_tokens - sum(first_lens))
    second = make_batch(15, second_lens, [16, 0, 7, 3], padding=num_tokens - sum(second_lens))
    assert [t.shape for t in (first.q, *first.poisoned)] == [t.shape for t in (second.q, *second.poisoned)]
    caches = [t.cuda() for t in first.poisoned[:2]]
    inputs = [t.cuda() for t in (first.q, first.poisoned[2], first.query_start, first.positions)]
    slots = token_slots(first).cuda()
    new = [cache.view(-1, 2, 32)[slots.clamp(min=0)] for cache in caches]  # rewrites the same values

    def step():
        torch.ops.helios.cache_write(*caches, *new, slots)
        return torch.ops.helios.paged_attention(inputs[0], *caches, *inputs[1:], SCALE, 0)

    step()  # compiles the kernels outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    second_slots = token_slots(second)
    for cache, source, values in zip(caches, second.poisoned[:2], new):
        holed = source.clone().view(-1, 2, 32)
        values.copy_(holed[second_slots.clamp(min=0)])
        holed[second_slots[second_slots >= 0]] = float("nan")
        cache.copy_(holed.view(source.shape))
    slots.copy_(second_slots)
    for buffer, value in zip(inputs, (second.q, second.poisoned[2], second.query_start, second.positions)):
        buffer.copy_(value)
    graph.replay()
    assert_matches_reference(out.cpu(), second, 0)
