"""helios::latent_cache_write and helios::paged_latent_attention: the CPU reference against the
up-projected (per-head key/value) attention it stands for, and the Triton kernels against the reference.

Without CUDA the kernels run under Triton's interpreter (set before triton is first imported, as in
test_triton_attention). Kernel inputs are poisoned: every cache slot outside the rows' contexts is NaN
and page-table entries past a row's last page point at a NaN page.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch

ON_CUDA = torch.cuda.is_available()
if not ON_CUDA:
    from helios.abi.triton_interpret import enable_interpreter

    enable_interpreter()

from helios.abi import latent_attention as _latent  # noqa: E402,F401  (registers the reference ops)
from helios.abi import triton_latent as kernels  # noqa: E402
from helios.abi.registry import AbiArgumentError  # noqa: E402

DEVICE = "cuda" if ON_CUDA else "cpu"
SCALE = 0.2
OPS = torch.ops.helios
TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


@dataclass(frozen=True)
class Batch:
    q_latent: torch.Tensor
    q_rope: torch.Tensor
    clean: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # latent_cache, rope_cache, page_table
    poisoned: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    query_start: torch.Tensor
    positions: torch.Tensor
    num_real_tokens: int


def make_batch(seed, query_lens, cached_lens, heads=4, latent_dim=24, rope_dim=8, page_tokens=4,
               dtype=torch.float32, padding=0) -> Batch:
    generator = torch.Generator().manual_seed(seed)
    contexts = [cached + new for cached, new in zip(cached_lens, query_lens)]
    row_pages = [-(-context // page_tokens) for context in contexts]
    num_pages = sum(row_pages) + 2  # the last page is the poison page
    order = torch.randperm(num_pages - 1, generator=generator).tolist()
    latent = torch.randn(num_pages, page_tokens, latent_dim, generator=generator).to(dtype)
    rope = torch.randn(num_pages, page_tokens, rope_dim, generator=generator).to(dtype)
    clean_table = torch.randint(0, num_pages, (len(contexts), max(row_pages) + 1), generator=generator,
                                dtype=torch.int32)
    poisoned_table = torch.full_like(clean_table, num_pages - 1)
    live = torch.zeros(num_pages, page_tokens, dtype=torch.bool)
    for row, context in enumerate(contexts):
        pages = torch.tensor([order.pop() for _ in range(row_pages[row])], dtype=torch.int32)
        clean_table[row, : len(pages)] = poisoned_table[row, : len(pages)] = pages
        slots = pages.long()[:, None] * page_tokens + torch.arange(page_tokens)
        live.view(-1)[slots.view(-1)[:context]] = True
    positions = [p for cached, new in zip(cached_lens, query_lens) for p in range(cached, cached + new)]
    tokens = len(positions) + padding
    q_latent = torch.randn(tokens, heads, latent_dim, generator=generator).to(dtype)
    q_rope = torch.randn(tokens, heads, rope_dim, generator=generator).to(dtype)
    poison = lambda cache: cache.masked_fill(~live[..., None], float("nan"))  # noqa: E731
    return Batch(q_latent, q_rope, (latent, rope, clean_table), (poison(latent), poison(rope), poisoned_table),
                 torch.tensor([0] + query_lens).cumsum(0).to(torch.int32),
                 torch.tensor(positions + [1_000_000] * padding, dtype=torch.int64), len(positions))


def reference(batch: Batch) -> torch.Tensor:
    latent, rope, table = batch.clean
    return OPS.paged_latent_attention(batch.q_latent, batch.q_rope, latent, rope, table, batch.query_start,
                                      batch.positions, SCALE)


def expanded_attention(batch: Batch, row: int, token: int) -> torch.Tensor:
    """Per-head attention with keys cat(W_k latent, rope) and values W_v latent, for random W_k, W_v:
    the absorbed op times W_v must equal it (the identity MLA decode relies on)."""
    latent, rope, table = batch.clean
    generator = torch.Generator().manual_seed(99)
    heads, latent_dim = batch.q_latent.shape[1:]
    w_k = torch.randn(heads, 6, latent_dim, generator=generator)
    w_v = torch.randn(heads, 5, latent_dim, generator=generator)
    q_nope = torch.randn(heads, 6, generator=generator)
    context = int(batch.positions[token]) + 1
    page_tokens = latent.shape[1]
    pages = table[row, : -(-context // page_tokens)].long()
    c = latent[pages].reshape(-1, latent_dim)[:context]
    r = rope[pages].reshape(-1, rope.shape[2])[:context]
    keys = torch.einsum("hdc,nc->hnd", w_k, c)
    scores = (torch.einsum("hd,hnd->hn", q_nope, keys) + batch.q_rope[token] @ r.T) * SCALE
    expected = torch.einsum("hn,hdc,nc->hd", scores.softmax(-1), w_v, c)
    absorbed = torch.einsum("hd,hdc->hc", q_nope, w_k)  # q folded into the key up-projection
    q_latent = batch.q_latent.clone()
    q_latent[token] = absorbed
    out = reference(replace(batch, q_latent=q_latent))[token]
    return torch.einsum("hc,hdc->hd", out, w_v), expected


def test_reference_equals_up_projected_attention():
    batch = make_batch(1, [3, 1], [5, 9])
    for row, token in ((0, 0), (0, 2), (1, 3)):
        ours, expected = expanded_attention(batch, row, token)
        torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)


def test_reference_padding_is_zero_and_rows_are_causal():
    batch = make_batch(2, [4, 0, 1], [0, 3, 6], padding=2)
    out = reference(batch)
    assert torch.all(out[batch.num_real_tokens:] == 0)
    first = make_batch(2, [4, 0, 1], [0, 3, 6], padding=2)
    latent, rope, table = first.clean
    latent[table[0, 1]] += 5.0  # positions 4.. of row 0 are not visible to its first four tokens
    torch.testing.assert_close(reference(first)[:4], out[:4])


def test_cache_write_reference_and_kernel_agree():
    generator = torch.Generator().manual_seed(3)
    latent = torch.randn(5, 24, generator=generator)
    rope = torch.randn(5, 8, generator=generator)
    slots = torch.tensor([7, -1, 0, 13, 2])
    planes = (torch.zeros(4, 4, 24), torch.zeros(4, 4, 8))
    OPS.latent_cache_write(*planes, latent, rope, slots)
    assert torch.equal(planes[0].view(-1, 24)[13], latent[3]) and torch.equal(planes[1].view(-1, 8)[0], rope[2])
    assert planes[0].view(-1, 24)[1].abs().sum() == 0
    device_planes = tuple(torch.zeros_like(p, device=DEVICE) for p in planes)
    kernels.triton_latent_cache_write(*device_planes, latent.to(DEVICE), rope.to(DEVICE), slots.to(DEVICE))
    assert all(torch.equal(a.cpu(), b) for a, b in zip(device_planes, planes))



def test_cache_write_kernel_is_exact_in_bfloat16_over_successive_writes():
    """The GPU graph test's inputs (DeepSeek-V3 planes, bfloat16, a padding slot) written three times
    into the same planes: the kernel copies bit for bit, as the reference's index_copy_ does."""
    generator = torch.Generator()
    planes = (torch.zeros(40, 16, 512, dtype=torch.bfloat16), torch.zeros(40, 16, 64, dtype=torch.bfloat16))
    device_planes = tuple(torch.zeros_like(p, device=DEVICE) for p in planes)
    for seed in (0, 1, 2):
        generator.manual_seed(seed)
        slots = torch.randperm(40 * 16, generator=generator)[:33]
        slots[5] = -1
        latent = torch.randn(33, 512, generator=generator).to(torch.bfloat16)
        rope = torch.randn(33, 64, generator=generator).to(torch.bfloat16)
        OPS.latent_cache_write(*planes, latent, rope, slots)
        kernels.triton_latent_cache_write(*device_planes, latent.to(DEVICE), rope.to(DEVICE), slots.to(DEVICE))
        assert all(torch.equal(a.cpu(), b) for a, b in zip(device_planes, planes))

def test_bad_arguments_are_typed_errors():
    batch = make_batch(4, [1], [2])
    latent, rope, table = batch.clean
    with pytest.raises(AbiArgumentError, match="q_rope"):
        OPS.paged_latent_attention(batch.q_latent, batch.q_rope[..., :3], latent, rope, table,
                                   batch.query_start, batch.positions, SCALE)
    with pytest.raises(AbiArgumentError, match="rope_cache"):
        OPS.latent_cache_write(latent, rope[:1], latent[0], rope[0], torch.zeros(4, dtype=torch.int64))


@pytest.mark.parametrize("query_lens,cached_lens,heads", [
    ([1, 1, 1, 1], [0, 5, 17, 40], 4),  # decode rows, ragged contexts
    ([3, 0, 1, 6], [2, 4, 9, 0], 20),  # multi-token rows, an inactive row, two head blocks
])
@pytest.mark.parametrize("split", [1, 3])
def test_kernel_matches_reference(query_lens, cached_lens, heads, split):
    batch = make_batch(5, query_lens, cached_lens, heads=heads, padding=1)
    latent, rope, table = (t.to(DEVICE) for t in batch.poisoned)
    out = kernels.triton_paged_latent_attention(
        batch.q_latent.to(DEVICE), batch.q_rope.to(DEVICE), latent, rope, table, batch.query_start.to(DEVICE),
        batch.positions.to(DEVICE), SCALE, split=split).cpu()
    assert torch.all(out[batch.num_real_tokens:] == 0)
    torch.testing.assert_close(out, reference(batch), **TOLERANCE[torch.float32])


@pytest.mark.parametrize("block_t", [None, 1, 2, 8])
@pytest.mark.parametrize("split", [1, 3])
def test_multi_token_rows_in_query_tiles_match_the_reference(block_t, split):
    """Prefill and speculative rows (9, 13 and 5 tokens, one over a long cached prefix) beside decode
    and inactive rows: tiles of `block_t` tokens (None: the launch's own choice) attend causally
    within the row; tiles cut rows at every offset."""
    batch = make_batch(8, [9, 1, 0, 13, 5], [0, 21, 3, 2, 37], heads=4, padding=2)
    assert kernels.latent_tiles(batch.q_latent.shape[0], 5, 4, 24) == (4, 16)  # T > R: 16 tokens x 4 heads
    latent, rope, table = (t.to(DEVICE) for t in batch.poisoned)
    out = kernels.triton_paged_latent_attention(
        batch.q_latent.to(DEVICE), batch.q_rope.to(DEVICE), latent, rope, table, batch.query_start.to(DEVICE),
        batch.positions.to(DEVICE), SCALE, split=split, block_t=block_t).cpu()
    assert torch.all(out[batch.num_real_tokens:] == 0)
    torch.testing.assert_close(out, reference(batch), **TOLERANCE[torch.float32])


def test_tiles_from_static_shapes():
    assert kernels.latent_tiles(8, 8, 16, 512) == (16, 1)  # decode: one token per program
    assert kernels.latent_tiles(256, 1, 16, 512) == (16, 2)  # a wide latent: 32 dot rows
    assert kernels.latent_tiles(256, 1, 16, 64) == (16, 4)
    assert kernels.latent_tiles(8, 8, 4, 32) == (4, 4)  # at least 16 dot rows


def test_kernel_bfloat16_with_more_splits_than_a_short_context_fills():
    batch = make_batch(6, [1, 1, 2], [3, 11, 70], latent_dim=32, rope_dim=16, dtype=torch.bfloat16)
    latent, rope, table = (t.to(DEVICE) for t in batch.poisoned)
    out = kernels.triton_paged_latent_attention(
        batch.q_latent.to(DEVICE), batch.q_rope.to(DEVICE), latent, rope, table, batch.query_start.to(DEVICE),
        batch.positions.to(DEVICE), SCALE, split=4).cpu()
    torch.testing.assert_close(out.float(), reference(batch).float(), **TOLERANCE[torch.bfloat16])


# The compiler, stricter than the interpreter, accepts both kernels (PTX and ptxas, sm_90):
# test_kernels_compile_for_hopper (compile_latent_kernels.py).


def test_split_count_comes_from_shapes_only():
    cpu = torch.device("cpu")
    assert kernels.latent_splits(1, 1, 4096, cpu) == 16  # batch 1: fill the (stand-in) device
    assert kernels.latent_splits(64, 8, 4096, cpu) == 1
    assert kernels.latent_splits(1, 1, 300, cpu) == 1  # no split shorter than 256 positions


def test_ops_have_cuda_kernels_registered():
    for op in ("helios::latent_cache_write", "helios::paged_latent_attention"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "CUDA")
