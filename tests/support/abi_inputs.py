"""Random inputs for every execution-ABI op, as keyword arguments of ``torch.ops.helios.<op>``.

Shared by the CPU tests of the ops' device paths (tests/abi/test_capturable.py) and the CUDA tests
(tests/gpu/test_ops_cuda.py), so the generators themselves run on every machine. Every function
returns CPU tensors drawn from `seed` alone; equal arguments give equal inputs, and inputs of one
op with equal size arguments always have equal shapes (a captured graph can replay new values).

Sampling logits are distinct within a row (a shuffled grid), so no two tokens tie and canonical
order is a property of the values, not of any tie rule; masks, NaN, infinities and penalties are
mixed in as the op meets them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

import helios.abi  # noqa: F401  (registers the ops)
from helios.abi.grammar import mask_words

OPS = torch.ops.helios
TEMPERATURES = (1.0, 0.0, 0.6, 1.5)  # row 0 draws; every fourth row is greedy
POISON = 50.0  # scale of cache entries no query may read


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _choice(generator: torch.Generator, options, count: int, dtype=torch.float32) -> torch.Tensor:
    index = torch.randint(0, len(options), (count,), generator=generator)
    return torch.tensor(options, dtype=dtype)[index]


def distinct_logits(rows: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """float32 [rows, vocab]: each row a shuffled grid of distinct values, spread 4..30 wide."""
    grid = torch.stack([torch.randperm(vocab, generator=generator) for _ in range(rows)]).float()
    spread = 4.0 + 26.0 * torch.rand(rows, 1, generator=generator)
    return (grid / vocab - 0.5) * spread


def control_inputs(rows: int, vocab: int, seed: int) -> dict:
    """Logits and every control of ``helios::sampling_weights`` (``sample`` minus seeds/counters)."""
    generator = _generator(seed)
    logits = distinct_logits(rows, vocab, generator)
    logits[1::3][torch.rand(logits[1::3].shape, generator=generator) < 0.02] = float("-inf")
    if rows > 2:
        logits[2, :3] = float("nan")
        logits[rows - 1, vocab // 2] = float("inf")
    temperature = torch.tensor([TEMPERATURES[i % len(TEMPERATURES)] for i in range(rows)])
    penalties = torch.stack([_choice(generator, (1.0, 1.3), rows), _choice(generator, (0.0, 0.4), rows),
                             _choice(generator, (0.0, 0.2), rows)], dim=1)
    counts = [((torch.rand(rows, vocab, generator=generator) < 0.01)
               * torch.randint(1, 4, (rows, vocab), generator=generator)).to(torch.int32) for _ in range(2)]
    grammar_mask = torch.randint(-2**31, 2**31, (rows, mask_words(vocab)), generator=generator, dtype=torch.int64)
    grammar_mask = grammar_mask.to(torch.int32)
    mask_rows = torch.rand(rows, generator=generator) < 0.25
    if rows > 2:
        grammar_mask[rows // 2], mask_rows[rows // 2] = 0, True  # a row whose grammar allows nothing
    return dict(logits=logits, temperature=temperature,
                top_k=_choice(generator, (0, 0, 40, 1000), rows, torch.int32),
                top_p=_choice(generator, (1.0, 1.0, 0.9, 0.5), rows), min_p=_choice(generator, (0.0, 0.0, 0.02), rows),
                penalties=penalties, prompt_counts=counts[0], output_counts=counts[1],
                grammar_mask=grammar_mask, mask_rows=mask_rows)


def seeds_and_counters(rows: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    seeds = torch.randint(-2**62, 2**62, (rows,), generator=generator)
    return seeds, torch.randint(0, 10**6, (rows,), generator=generator)


def sample_inputs(rows: int, vocab: int, seed: int) -> dict:
    """Keyword arguments of ``helios::sample``."""
    controls = control_inputs(rows, vocab, seed)
    seeds, counters = seeds_and_counters(rows, _generator(seed + 1))
    return dict(logits=controls.pop("logits"), seeds=seeds, counters=counters, **controls)


def draw_inputs(rows: int, vocab: int, seed: int) -> dict:
    """``helios::draw_weighted`` arguments: the sampling weights of random controls."""
    weights = OPS.sampling_weights(**control_inputs(rows, vocab, seed))
    seeds, counters = seeds_and_counters(rows, _generator(seed + 1))
    return dict(weights=weights, seeds=seeds, counters=counters, offset=2)


def verify_inputs(lanes: int, width: int, drafts: int, vocab: int, seed: int) -> dict:
    """``helios::verify_proposals`` arguments: target weights of random controls; proposal weights
    mostly the target's (so proposals are often accepted) mixed with an unrelated distribution;
    proposals drawn from them; every third lane copies one-hot candidates instead."""
    assert drafts <= width
    generator = _generator(seed)
    target = OPS.sampling_weights(**control_inputs(lanes * width, vocab, seed)).view(lanes, width, vocab)
    other = OPS.sampling_weights(**control_inputs(lanes * drafts, vocab, seed + 7)).view(lanes, drafts, vocab)
    normalised = lambda w: w / w.sum(-1, keepdim=True).clamp(min=1e-300)  # noqa: E731
    proposal = 0.7 * normalised(target[:, :drafts]) + 0.3 * normalised(other)
    seeds, counters = seeds_and_counters(lanes * drafts, generator)
    proposals = OPS.draw_weighted(proposal.reshape(lanes * drafts, vocab), seeds, counters, 0).view(lanes, drafts)
    copied = torch.arange(lanes) % 3 == 2
    one_hot = torch.nn.functional.one_hot(proposals.clamp(min=0), vocab).to(torch.float64)
    proposal = torch.where(copied[:, None, None], one_hot, proposal)
    lengths = torch.randint(0, drafts + 2, (lanes,), generator=generator)
    seeds, counters = seeds_and_counters(lanes, generator)
    return dict(target_weights=target, proposals=proposals, proposal_weights=proposal, lengths=lengths,
                seeds=seeds, counters=counters)


def allocate_inputs(lanes: int, drafts: int, seed: int) -> dict:
    """``helios::allocate_prefixes`` arguments: a valid cohort whose ceilings exceed the capacity."""
    generator = _generator(seed)
    confidence = torch.rand(lanes, drafts, generator=generator)
    confidence[torch.rand(lanes, drafts, generator=generator) < 0.1] = 1.0
    ceilings = torch.randint(0, drafts + 2, (lanes,), generator=generator, dtype=torch.int32)
    capacity = max(1, int((ceilings > 0).sum()) + lanes)
    return dict(confidence=confidence, ceilings=ceilings, capacity=capacity)


def grammar_inputs(rows: int, vocab: int, dtype: torch.dtype, seed: int) -> dict:
    """``helios::apply_grammar_mask`` arguments (logits of `dtype`, NaN included)."""
    generator = _generator(seed)
    logits = torch.randn(rows, vocab, generator=generator).to(dtype)
    logits[0, :2] = float("nan")
    mask = torch.randint(-2**31, 2**31, (rows, mask_words(vocab)), generator=generator, dtype=torch.int64)
    return dict(logits=logits, grammar_mask=mask.to(torch.int32),
                mask_rows=torch.rand(rows, generator=generator) < 0.5)


def record_inputs(rows: int, seed: int, draft_lag: int | None) -> dict:
    """``helios::completion_record`` arguments (int64 columns, a one-element submission)."""
    generator = _generator(seed)
    column = lambda high: torch.randint(0, high, (rows,), generator=generator)  # noqa: E731
    return dict(slots=column(64), generations=column(2**40), submission=column(2**40)[:1], tokens=column(150_000),
                offered=column(8), accepted=column(8), emitted=column(9), consumed_end=column(4096),
                draft_lag=draft_lag)


def philox_inputs(rows: int, seed: int) -> dict:
    """``helios::philox4x32`` / ``philox_uniform`` arguments over the whole int64 range."""
    generator = _generator(seed)
    seeds = torch.randint(-2**63, 2**63 - 1, (rows,), generator=generator)
    counters = torch.randint(-2**63, 2**63 - 1, (rows,), generator=generator)
    return dict(seeds=seeds, counters=counters, offset=2**32 + seed)


# -- paged attention and cache writes ------------------------------------------------------------


@dataclass(frozen=True)
class AttentionCase:
    """A packed batch: per row (context tokens after this step, query tokens); query 0 = inactive.

    Shapes depend only on the row count, the query lengths, `padding` and `max_context`, so two
    cases that differ only in contexts (each <= max_context) replay in one captured graph.
    """

    name: str
    rows: tuple[tuple[int, int], ...]
    q_heads: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    max_context: int
    page_tokens: int = 16
    padding: int = 0  # packed tokens after the last row: their outputs must be zero
    window: int = 0

    @property
    def max_pages(self) -> int:
        return -(-self.max_context // self.page_tokens) + 1  # one spare column, never needed

    @property
    def num_pages(self) -> int:
        return len(self.rows) * self.max_pages + 2


def attention_inputs(case: AttentionCase, seed: int) -> dict:
    """``helios::paged_attention`` arguments for `case`. Each row's pages are scattered; every cache
    entry outside the rows' contexts (and every page-table entry past a row's pages) holds large
    random values (one vector per page and head), so reading one shows in the output."""
    assert all(0 <= n <= c <= case.max_context for c, n in case.rows), case
    generator = _generator(seed)
    pt, heads, dim = case.page_tokens, case.kv_heads, case.head_dim
    shape = (case.num_pages, pt, heads, dim)
    k_cache = (POISON * torch.randn(case.num_pages, 1, heads, dim, generator=generator)).expand(shape).clone()
    v_cache = (POISON * torch.randn(case.num_pages, 1, heads, dim, generator=generator)).expand(shape).clone()
    order = torch.randperm(case.num_pages, generator=generator)
    poison_page = int(order[-1])
    page_table = torch.full((len(case.rows), case.max_pages), poison_page, dtype=torch.int32)
    for row, (context, _) in enumerate(case.rows):
        needed = -(-context // pt)
        page_table[row, :needed] = order[row * case.max_pages:row * case.max_pages + needed].to(torch.int32)
        pages = page_table[row, :needed].long()
        slots = (pages[:, None] * pt + torch.arange(pt)).reshape(-1)[:context]
        k_cache.view(-1, heads, dim)[slots] = torch.randn(context, heads, dim, generator=generator)
        v_cache.view(-1, heads, dim)[slots] = torch.randn(context, heads, dim, generator=generator)
    lengths = [n for _, n in case.rows]
    query_start = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0).to(torch.int32)
    positions = [p for c, n in case.rows for p in range(c - n, c)] + [0] * case.padding
    q = torch.randn(len(positions), case.q_heads, dim, generator=generator)
    return dict(q=q.to(case.dtype), k_cache=k_cache.to(case.dtype), v_cache=v_cache.to(case.dtype),
                page_table=page_table, query_start=query_start, positions=torch.tensor(positions, dtype=torch.int64),
                scale=1.0 / math.sqrt(dim), window=case.window)


def cache_write_inputs(num_pages: int, page_tokens: int, kv_heads: int, head_dim: int, tokens: int,
                       dtype: torch.dtype, seed: int) -> dict:
    """``helios::cache_write`` arguments: distinct random slots, about one in eight padding (-1)."""
    generator = _generator(seed)
    shape = (num_pages, page_tokens, kv_heads, head_dim)
    slots = torch.randperm(num_pages * page_tokens, generator=generator)[:tokens]
    slots[torch.rand(tokens, generator=generator) < 0.125] = -1
    return dict(k_cache=torch.randn(shape, generator=generator).to(dtype),
                v_cache=torch.randn(shape, generator=generator).to(dtype),
                k=torch.randn(tokens, kv_heads, head_dim, generator=generator).to(dtype),
                v=torch.randn(tokens, kv_heads, head_dim, generator=generator).to(dtype), slot_mapping=slots)
