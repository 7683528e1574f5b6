"""Every execution-ABI op on CUDA: its CPU reference's results, no synchronisation, and graph replay.

For each op (and each shape that matters) three checks on fresh random inputs
(tests/support/abi_inputs.py, the generators the CPU tests run as well):

1. on CUDA it gives the CPU result: exactly for sampling, draws, verification, allocation, masks,
   records, Philox and cache writes; within float tolerances for attention;
2. its body does not synchronise: a second call runs under
   ``torch.cuda.set_sync_debug_mode("error")`` (the first call may compile or autotune);
3. it is captured once into a ``torch.cuda.CUDAGraph``, new values are copied into the static
   inputs, and a replay gives the CPU result for those values.

Sampled tokens are compared exactly. CPU and CUDA use the same Philox uniform (float64) and the
same canonical order (logits are distinct within a row, so no tie rule is involved); softmax and
prefix sums round differently on the two devices, and a token differs only if u * C falls within
those few ulps of a boundary (about 1e-8 per row at V = 150k), which these fixed seeds do not hit.
"""

from __future__ import annotations

import dataclasses
import os
import random

import pytest
import torch

from helios.abi import sampling, token_logprobs  # noqa: F401 - token_logprobs registers its op
from support.abi_inputs import (
    AttentionCase,
    allocate_inputs,
    attention_inputs,
    cache_write_inputs,
    control_inputs,
    draw_inputs,
    grammar_inputs,
    philox_inputs,
    record_inputs,
    sample_inputs,
    verify_inputs,
)
from support.cuda_calls import capture, to_cuda, without_sync

pytestmark = pytest.mark.gpu
OPS = torch.ops.helios
DEVICE = "cuda"


@pytest.fixture(scope="module", autouse=True)
def cpu_threads():
    """The CPU references of large inputs use the GPU host's cores (conftest pins one thread)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(min(16, os.cpu_count() or 1))
    yield
    torch.set_num_threads(threads)


def load(static: dict, fresh: dict, names=None) -> None:
    """Copies `fresh` values into the static inputs (non-tensor arguments must be unchanged)."""
    for name in names or fresh:
        value = fresh[name]
        if isinstance(value, torch.Tensor):
            static[name].copy_(value)
        else:
            assert static[name] == value, name


def identical(actual, expected) -> None:
    actual = actual if isinstance(actual, (tuple, list)) else (actual,)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        assert got.device.type == DEVICE
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, equal_nan=True)


def check_pure_op(op: str, make, compare=identical) -> None:
    """The three checks of the module docstring for an op without mutated inputs; `make(seed)`
    gives inputs of one shape for every seed."""
    function = getattr(OPS, op)
    inputs = make(0)
    compare(function(**to_cuda(inputs)), function(**inputs))
    static = to_cuda(make(1))
    compare(without_sync(lambda: function(**static)), function(**make(1)))
    graph, outputs = capture(lambda: function(**static))
    for seed in (2, 3):
        fresh = make(seed)
        load(static, fresh)
        graph.replay()
        torch.cuda.synchronize()
        compare(outputs, function(**fresh))


# -- sampling and speculative ops ----------------------------------------------------------------

SAMPLE_SHAPES = [(1, 151936), (8, 128256), (33, 32000), (64, 32768)]


def compare_tokens(actual: torch.Tensor, expected: torch.Tensor, temperature: torch.Tensor) -> None:
    actual = actual.cpu()
    greedy = ~(temperature > 0)
    assert torch.equal(actual[greedy], expected[greedy]), "greedy rows differ"
    assert torch.equal(actual, expected), "seeded draws differ"


@pytest.mark.parametrize("rows,vocab", SAMPLE_SHAPES)
def test_sample(rows, vocab):
    make = lambda seed: sample_inputs(rows, vocab, seed=100 * rows + seed)  # noqa: E731
    inputs = make(0)
    expected = OPS.sample(**inputs)
    drawn = inputs["temperature"] > 0
    assert bool((expected[drawn] != inputs["logits"][drawn].argmax(-1)).any())  # the inputs really draw
    check_pure_op("sample", make, lambda a, e: compare_tokens(a, e, inputs["temperature"]))


def logprob_inputs(rows: int, vocab: int, seed: int) -> dict:
    """Keyword arguments of ``helios::token_logprobs`` (some rows without a token)."""
    controls = control_inputs(rows, vocab, seed)
    for name in ("temperature", "top_k", "top_p", "min_p"):
        del controls[name]
    tokens = controls["logits"].argmax(dim=-1)
    tokens[::5] = -1
    return dict(logits=controls.pop("logits"), tokens=tokens, **controls, num_top=5)


def weights_inputs(rows: int, vocab: int, seed: int) -> dict:
    """Keyword arguments of ``helios::sampling_weights`` (``sample``'s less seeds and counters)."""
    inputs = sample_inputs(rows, vocab, seed)
    del inputs["seeds"], inputs["counters"]
    return inputs


@pytest.mark.parametrize("op,make", [("sample", sample_inputs), ("token_logprobs", logprob_inputs),
                                     ("sampling_weights", weights_inputs), ("draw_weighted", draw_inputs)])
def test_row_blocks_change_no_value(op, make, monkeypatch):
    """80 rows of a 128k vocabulary run in row blocks of 32 (`helios.abi.sampling.row_blocks`):
    the values of all rows at once, bit for bit, eager and in a captured graph."""
    function = getattr(OPS, op)
    static = to_cuda(make(80, 128256, seed=7))
    monkeypatch.setattr(sampling, "ROW_BLOCK_ELEMENTS", 1 << 62)
    whole = tuple(value.cpu() for value in _tuple(function(**static)))
    monkeypatch.setattr(sampling, "ROW_BLOCK_ELEMENTS", 32 * 128256)
    assert sampling.row_blocks(80, 128256) == [slice(0, 32), slice(32, 64), slice(64, 80)]
    identical(function(**static), whole)
    graph, outputs = capture(lambda: function(**static))
    graph.replay()
    torch.cuda.synchronize()
    identical(outputs, whole)


def _tuple(value) -> tuple:
    return value if isinstance(value, tuple) else (value,)


def close_weights(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Same kept tokens; probabilities equal up to softmax rounding."""
    actual = actual.cpu()
    assert torch.equal(actual > 0, expected > 0)
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("rows,vocab", [(1, 151936), (16, 32000)])
def test_sampling_weights(rows, vocab):
    def make(seed):
        inputs = sample_inputs(rows, vocab, seed=seed)
        del inputs["seeds"], inputs["counters"]
        return inputs

    check_pure_op("sampling_weights", make, close_weights)


@pytest.mark.parametrize("rows,vocab", [(1, 151936), (64, 32000)])
def test_draw_weighted(rows, vocab):
    check_pure_op("draw_weighted", lambda seed: draw_inputs(rows, vocab, seed=seed))


@pytest.mark.parametrize("lanes,width,drafts,vocab", [(1, 5, 4, 151936), (16, 4, 3, 32000), (64, 2, 1, 32000)])
def test_verify_proposals(lanes, width, drafts, vocab):
    check_pure_op("verify_proposals", lambda seed: verify_inputs(lanes, width, drafts, vocab, seed=seed))


@pytest.mark.parametrize("lanes,drafts", [(1, 1), (16, 4), (64, 7)])
def test_allocate_prefixes(lanes, drafts):
    capacity = allocate_inputs(lanes, drafts, seed=0)["capacity"]

    def make(seed):  # one capacity: it is an int argument, fixed in a captured graph
        return dict(allocate_inputs(lanes, drafts, seed=seed), capacity=capacity)

    check_pure_op("allocate_prefixes", make)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,vocab", [(1, 151936), (64, 32000)])
def test_apply_grammar_mask(rows, vocab, dtype):
    check_pure_op("apply_grammar_mask", lambda seed: grammar_inputs(rows, vocab, dtype, seed=seed))


@pytest.mark.parametrize("draft_lag", [None, 0, 3])
@pytest.mark.parametrize("rows", [1, 64])
def test_completion_record(rows, draft_lag):
    check_pure_op("completion_record", lambda seed: record_inputs(rows, seed=seed, draft_lag=draft_lag))


@pytest.mark.parametrize("op", ["philox4x32", "philox_uniform"])
@pytest.mark.parametrize("rows", [1, 64, 4096])
def test_philox(op, rows):
    offset = philox_inputs(rows, seed=0)["offset"]
    check_pure_op(op, lambda seed: dict(philox_inputs(rows, seed=seed), offset=offset))


# -- paged attention and cache writes ------------------------------------------------------------


def ragged(count: int, high: int, seed: int) -> list[int]:
    """`count` context lengths in [1, high], the page-boundary extremes and `high` included."""
    chooser = random.Random(seed)
    contexts = [1, 15, 16, 17, high] + [chooser.randint(1, high) for _ in range(count - 5)]
    chooser.shuffle(contexts)
    return contexts[:count]


def decode_rows(count: int, high: int, seed: int) -> tuple:
    return tuple((context, 1) for context in ragged(count, high, seed))


PREFILL_ROWS = ((300, 300), (1024 + 77, 77), (16, 16), (2048, 512), (33, 1))  # prompts over cached prefixes
MIXED_ROWS = ((4000, 1), (17, 17), (0, 0), (1500, 129), (1, 1), (2049, 1), (640, 64), (3, 3))
FEW_TOKEN_ROWS = ((3000, 3), (0, 0), (0, 0), (17, 1), (1, 1), (0, 0), (640, 2), (0, 0))  # T <= R, several per row
ATTENTION_CASES = [
    AttentionCase("decode-fp32-gqa4", decode_rows(64, 4096, 1), 8, 2, 64, torch.float32, 4096),
    AttentionCase("decode-bf16-gqa4", decode_rows(32, 4096, 2), 32, 8, 128, torch.bfloat16, 4096),
    AttentionCase("decode-bf16-mha", decode_rows(16, 1024, 3), 4, 4, 64, torch.bfloat16, 1024),
    AttentionCase("prefill-fp32-gqa4", PREFILL_ROWS, 16, 4, 128, torch.float32, 2048),
    AttentionCase("prefill-bf16-gqa4", PREFILL_ROWS, 16, 4, 128, torch.bfloat16, 2048),
    AttentionCase("mixed-fp32-gqa4", MIXED_ROWS, 8, 2, 64, torch.float32, 4096, padding=7),
    AttentionCase("mixed-bf16-gqa4", MIXED_ROWS, 8, 2, 64, torch.bfloat16, 4096, padding=7),
    AttentionCase("mixed-bf16-window256", MIXED_ROWS, 8, 2, 64, torch.bfloat16, 4096, padding=7, window=256),
    AttentionCase("mixed-fp16-gqa8", MIXED_ROWS, 8, 1, 128, torch.float16, 4096, padding=7),
    AttentionCase("few-tokens-bf16-window100", FEW_TOKEN_ROWS, 8, 2, 64, torch.bfloat16, 4096, window=100),
    AttentionCase("few-tokens-fp32", FEW_TOKEN_ROWS, 8, 2, 64, torch.float32, 4096, padding=1),
]
# dtype -> (atol, rtol, bound on the mean absolute error); float32 products are exact (no TF32)
ATTENTION_TOLERANCE = {
    torch.float32: (1e-4, 1e-4, 1e-5),
    torch.bfloat16: (3e-2, 3e-2, 4e-3),
    torch.float16: (1e-2, 1e-2, 1e-3),
}


def close_attention(actual: torch.Tensor, expected: torch.Tensor, inputs: dict) -> None:
    """Within the dtype's tolerance; tokens past the last row (padding) exactly zero."""
    actual = actual.cpu()
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    end = int(inputs["query_start"][-1])
    assert bool((actual[end:] == 0).all()), "padding tokens must come back zero"
    atol, rtol, mean = ATTENTION_TOLERANCE[expected.dtype]
    error = (actual[:end].float() - expected[:end].float()).abs()
    beyond = error - rtol * expected[:end].float().abs()
    assert float(beyond.max()) <= atol, f"max error {float(error.max()):.3g} beyond atol {atol} + rtol {rtol}"
    assert float(error.mean()) <= mean, f"mean error {float(error.mean()):.3g} > {mean}"


def recontext(case: AttentionCase, seed: int) -> AttentionCase:
    """The same shapes (row count, query lengths) with other contexts, each in [query, max]."""
    chooser = random.Random(seed)
    rows = tuple((chooser.randint(max(n, 1), case.max_context), n) for _, n in case.rows)
    return dataclasses.replace(case, rows=rows)


@pytest.mark.parametrize("case", ATTENTION_CASES, ids=lambda c: c.name)
def test_paged_attention(case):
    inputs = attention_inputs(case, seed=0)
    close_attention(OPS.paged_attention(**to_cuda(inputs)), OPS.paged_attention(**inputs), inputs)
    cpu = attention_inputs(case, seed=1)
    static = to_cuda(cpu)
    close_attention(without_sync(lambda: OPS.paged_attention(**static)), OPS.paged_attention(**cpu), cpu)
    graph, output = capture(lambda: OPS.paged_attention(**static))
    for seed in (2, 3):
        fresh = attention_inputs(recontext(case, seed), seed=seed)
        load(static, fresh)
        graph.replay()
        torch.cuda.synchronize()
        close_attention(output, OPS.paged_attention(**fresh), fresh)


CACHE_WRITES = [  # num_pages, page_tokens, kv_heads, head_dim, tokens (a decode batch, a prefill chunk)
    (512, 16, 8, 128, 64),
    (300, 16, 2, 64, 1000),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", CACHE_WRITES, ids=lambda s: f"{s[4]}tokens")
def test_cache_write(shape, dtype):
    make = lambda seed: cache_write_inputs(*shape, dtype=dtype, seed=seed)  # noqa: E731
    expected, on_cuda = make(0), to_cuda(make(0))
    OPS.cache_write(**expected)
    OPS.cache_write(**on_cuda)
    identical((on_cuda["k_cache"], on_cuda["v_cache"]), (expected["k_cache"], expected["v_cache"]))

    static, expected = to_cuda(make(1)), make(1)
    without_sync(lambda: OPS.cache_write(**static))  # writing the same values twice writes them once
    OPS.cache_write(**expected)
    identical((static["k_cache"], static["v_cache"]), (expected["k_cache"], expected["v_cache"]))

    graph, _ = capture(lambda: OPS.cache_write(**static))
    for seed in (2, 3):
        torch.cuda.synchronize()
        expected = dict(make(seed), k_cache=static["k_cache"].cpu(), v_cache=static["v_cache"].cpu())
        load(static, expected, names=("k", "v", "slot_mapping"))
        graph.replay()
        torch.cuda.synchronize()
        OPS.cache_write(**expected)
        identical((static["k_cache"], static["v_cache"]), (expected["k_cache"], expected["v_cache"]))
