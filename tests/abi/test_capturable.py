"""The device paths of the execution-ABI op bodies, checked on the CPU.

Off the CPU every op body must be capturable into a CUDA graph: no host read of device data and no
host tensor copied in. Here each body runs its device path on CPU tensors (`sampling.selective`
patched to answer False, as it does for CUDA) under `forbid_host_sync`, the CPU stand-in for CUDA's
sync debug mode, and must give the CPU path's result bit for bit; each body also runs on meta
tensors, where any data-dependent step fails. tests/gpu/test_ops_cuda.py repeats this on CUDA with
the real sync debug mode and graph capture.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helios.abi import completion, grammar, rng, sampling, speculative, token_logprobs
from support.abi_inputs import (
    AttentionCase,
    allocate_inputs,
    attention_inputs,
    cache_write_inputs,
    draw_inputs,
    grammar_inputs,
    philox_inputs,
    record_inputs,
    sample_inputs,
    verify_inputs,
)
from support.host_sync import HostSyncError, forbid_host_sync

OPS = torch.ops.helios


def _sample(logits, seeds, counters, temperature, top_k, top_p, min_p, penalties, prompt_counts,
            output_counts, grammar_mask, mask_rows):
    params = sampling.DrawParams(seeds, counters, temperature, top_k, top_p, min_p)
    return sampling.sample_reference(logits, params, penalties, (prompt_counts, output_counts),
                                     grammar_mask, mask_rows)


def _weights(logits, temperature, top_k, top_p, min_p, penalties, prompt_counts, output_counts,
             grammar_mask, mask_rows):
    return speculative.sampling_weights_reference(logits, (temperature, top_k, top_p, min_p), penalties,
                                                  (prompt_counts, output_counts), grammar_mask, mask_rows)


def _without(inputs: dict, *names: str) -> dict:
    return {name: value for name, value in inputs.items() if name not in names}


# op name -> (its body on validated inputs, its inputs, whether the body asks `selective`)
CASES = {
    "sample": (_sample, lambda: sample_inputs(37, 300, seed=1), True),
    "sampling_weights": (_weights, lambda: _without(sample_inputs(29, 200, seed=2), "seeds", "counters"), False),
    "draw_weighted": (speculative.draw_reference, lambda: draw_inputs(29, 200, seed=3), True),
    "verify_proposals": (speculative.verify_reference, lambda: verify_inputs(13, 4, 3, 90, seed=4), True),
    "allocate_prefixes": (speculative.allocate_reference, lambda: allocate_inputs(17, 5, seed=5), False),
    "apply_grammar_mask": (grammar.masked_logits, lambda: grammar_inputs(9, 77, torch.bfloat16, seed=6), False),
    "completion_record": (completion.record_columns, lambda: record_inputs(11, seed=7, draft_lag=2), False),
    "philox4x32": (rng.philox_words, lambda: philox_inputs(50, seed=8), False),
    "philox_uniform": (lambda **a: rng.uniform24(rng.philox_words(**a)), lambda: philox_inputs(50, seed=9), False),
}


def _assert_identical(actual, expected) -> None:
    for got, want in zip(actual if isinstance(actual, tuple) else (actual,),
                         expected if isinstance(expected, tuple) else (expected,)):
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@pytest.fixture
def device_path(monkeypatch) -> list:
    """Makes op bodies take their device path on the CPU; records the devices they asked about."""
    asked = []

    def selective(device: torch.device) -> bool:
        asked.append(device)
        return False

    monkeypatch.setattr(sampling, "selective", selective)
    return asked


@pytest.mark.parametrize("op", sorted(CASES))
def test_device_path_is_capturable_and_equals_the_cpu_path(op, device_path):
    body, make_inputs, asks = CASES[op]
    inputs = make_inputs()
    expected = getattr(OPS, op)(**inputs)  # through the registered op: the CPU path
    with forbid_host_sync():
        actual = body(**inputs)
    _assert_identical(actual, expected)
    assert bool(device_path) == asks


@pytest.mark.parametrize("op", ["sample", "draw_weighted", "verify_proposals"])
def test_cpu_path_selects_rows_on_the_host(op):
    """The guard sees the CPU path's row selection: the device-path test above is not vacuous."""
    body, make_inputs, _ = CASES[op]
    inputs = make_inputs()
    with pytest.raises(HostSyncError, match="nonzero"), forbid_host_sync():
        body(**inputs)


@pytest.mark.parametrize("op", sorted(CASES))
def test_device_path_runs_on_meta_tensors(op):
    """Meta tensors have no data: any data-dependent step or host tensor in the body fails here."""
    body, make_inputs, _ = CASES[op]
    inputs = make_inputs()
    expected = getattr(OPS, op)(**inputs)
    meta = body(**{name: v.to("meta") if isinstance(v, torch.Tensor) else v for name, v in inputs.items()})
    for got, want in zip(meta if isinstance(meta, tuple) else (meta,),
                         expected if isinstance(expected, tuple) else (expected,)):
        assert got.device.type == "meta" and got.shape == want.shape and got.dtype == want.dtype


GUARDED = {
    "item": lambda x: x[0].item(),
    "bool": lambda x: bool(x[0] > 0),
    "int": lambda x: int(x[0]),
    "tolist": lambda x: x.tolist(),
    "nonzero": lambda x: x.nonzero(),
    "where one argument": lambda x: torch.where(x > 0),
    "boolean index": lambda x: x[x > 0],
    "boolean assignment": lambda x: x.clone().__setitem__(x > 0, 0.0),
    "host data": lambda x: x + torch.tensor([1.0, 2.0, 3.0, 4.0]),
    "factory without device": lambda x: x + torch.zeros(4),
    "move": lambda x: x.to("cpu"),
    "0-d tensor index": lambda x: x[torch.argmax(x)],
}
ALLOWED = {
    "elementwise": lambda x: torch.where(x > 0, x, 0.0).cumsum(0),
    "factory with device": lambda x: x + torch.arange(4, device=x.device),
    "like": lambda x: torch.full_like(x, 2.0) + x.new_zeros(4),
    "integer index": lambda x: x[torch.argsort(x)],
    "one-element index": lambda x: x[torch.argmax(x).view(1)],
    "dtype": lambda x: x.to(torch.float64),
}


@pytest.mark.parametrize("name", sorted(GUARDED))
def test_guard_rejects_host_reads_and_host_tensors(name):
    values = torch.tensor([0.5, -1.0, 2.0, 0.0])
    with pytest.raises(HostSyncError), forbid_host_sync():
        GUARDED[name](values)


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_guard_allows_device_code(name):
    values = torch.tensor([0.5, -1.0, 2.0, 0.0])
    with forbid_host_sync():
        ALLOWED[name](values)


def test_attention_inputs_hide_poison_and_replay_with_other_contexts():
    """The CUDA tests' attention inputs: the reference reads no poisoned entry, padding tokens come
    back zero, and a case with other contexts (<= max_context) keeps every shape."""
    case = AttentionCase("mixed", ((40, 1), (17, 17), (0, 0), (100, 30), (1, 1)), q_heads=4, kv_heads=2,
                         head_dim=8, dtype=torch.float32, max_context=128, padding=3, window=0)
    other = dataclasses.replace(case, rows=((128, 1), (20, 17), (5, 0), (31, 30), (90, 1)), window=24)
    inputs, again = attention_inputs(case, seed=1), attention_inputs(other, seed=2)
    for name, value in inputs.items():
        if isinstance(value, torch.Tensor):
            assert value.shape == again[name].shape and value.dtype == again[name].dtype, name
    assert inputs["k_cache"].abs().max() > 100  # poison is there ...
    for args in (inputs, again):
        out = OPS.paged_attention(**args)
        assert out[:-3].abs().max() < 8 and bool((out[-3:] == 0).all())  # ... and never read


def test_cache_write_inputs_keep_padding_slots_untouched():
    inputs = cache_write_inputs(num_pages=6, page_tokens=4, kv_heads=2, head_dim=8, tokens=20,
                                dtype=torch.bfloat16, seed=3)
    before = inputs["k_cache"].clone()
    OPS.cache_write(**inputs)
    slots = inputs["slot_mapping"]
    assert bool((slots < 0).any()) and len(set(slots[slots >= 0].tolist())) == int((slots >= 0).sum())
    flat, old = inputs["k_cache"].view(-1, 2, 8), before.view(-1, 2, 8)
    assert torch.equal(flat[slots[slots >= 0]], inputs["k"][slots >= 0])
    untouched = torch.ones(flat.shape[0], dtype=torch.bool)
    untouched[slots[slots >= 0]] = False
    assert torch.equal(flat[untouched], old[untouched])


def test_greedy_device_path_equals_the_full_path_when_no_row_draws(device_path):
    """The greedy-only graph a runtime replays for all-greedy steps selects the tokens of the full
    pipeline (penalties and grammar masks included), and draws nothing where a row would."""
    inputs = sample_inputs(12, 301, seed=21)
    greedy = dict(inputs, temperature=torch.where(torch.arange(12) % 2 == 0, 0.0, -1.0))
    greedy["temperature"][3] = float("nan")
    expected = OPS.sample(**greedy)  # the CPU path: no row draws
    with forbid_host_sync():
        actual = sampling.sample_reference(*_sample_arguments(greedy), draws=False)
    _assert_identical(actual, expected)
    skipped = sampling.sample_reference(*_sample_arguments(inputs), draws=False)
    drawn = OPS.sample(**inputs)
    draws = inputs["temperature"] > 0
    assert torch.equal(skipped[~draws], drawn[~draws]) and not torch.equal(skipped[draws], drawn[draws])
    assert torch.equal(sampling.SampleVariant.GREEDY(**inputs), skipped)  # the variant a greedy graph binds


def _sample_arguments(inputs: dict) -> tuple:
    params = sampling.DrawParams(inputs["seeds"], inputs["counters"], inputs["temperature"], inputs["top_k"],
                                 inputs["top_p"], inputs["min_p"])
    return (inputs["logits"], params, inputs["penalties"], (inputs["prompt_counts"], inputs["output_counts"]),
            inputs["grammar_mask"], inputs["mask_rows"])


def test_device_path_draws_in_row_blocks_with_the_cpu_paths_tokens(device_path, monkeypatch):
    """The device path's float64 draws run a few rows at a time (its temporaries stay small at
    any batch, `sampling.row_blocks`) and still give the CPU path's tokens."""
    body, make_inputs, _ = CASES["sample"]
    inputs = make_inputs()  # 37 rows, 300 tokens
    expected = OPS.sample(**inputs)
    monkeypatch.setattr(sampling, "ROW_BLOCK_ELEMENTS", 5 * 300)
    drawn_rows = []
    draw_tokens = sampling.draw_tokens
    monkeypatch.setattr(sampling, "draw_tokens", lambda logits, params: drawn_rows.append(len(logits))
                        or draw_tokens(logits, params))
    with forbid_host_sync():
        actual = body(**inputs)
    _assert_identical(actual, expected)
    assert drawn_rows == [5] * 7 + [2]


@pytest.mark.parametrize("rows", [0, 1, 7])
@pytest.mark.parametrize("block", [299, 600, 1 << 22], ids=["row-longer-than-a-block", "two-rows", "one-block"])
def test_row_blocks_at_the_edges_give_the_cpu_paths_values(device_path, monkeypatch, rows, block):
    """No row, one row, rows not a multiple of the block, and a vocabulary longer than a block (one
    row per block): the device path's draws and token logprobs are the CPU path's, bit for bit."""
    inputs = {name: value[:rows] for name, value in sample_inputs(7, 300, seed=11).items()}
    with monkeypatch.context() as cpu_path:
        cpu_path.setattr(sampling, "selective", lambda device: True)
        tokens = OPS.sample(**inputs)
    logprob_args = [inputs["logits"], tokens, *(inputs[name] for name in (
        "penalties", "prompt_counts", "output_counts", "grammar_mask", "mask_rows"))]
    expected = [OPS.token_logprobs(*logprob_args, num_top) for num_top in (0, 3)]
    monkeypatch.setattr(sampling, "ROW_BLOCK_ELEMENTS", block)
    with forbid_host_sync():
        drawn = _sample(**inputs)
        blocked = [token_logprobs.logprobs_reference(*logprob_args, num_top) for num_top in (0, 3)]
    _assert_identical(drawn, tokens)
    for got, want in zip(blocked, expected):
        assert all(a.shape == w.shape and a.dtype == w.dtype and torch.equal(a, w) for a, w in zip(got, want))


@pytest.mark.parametrize("op,blocked", [("sampling_weights", "_weights_rows"), ("draw_weighted", "_draw_rows"),
                                        ("verify_proposals", "_draw_rows")])
def test_speculative_ops_in_row_blocks_give_the_cpu_paths_values(device_path, monkeypatch, op, blocked):
    """The speculative ops' float64 weights and draws run a few rows at a time too (their temporaries
    stay block-sized in a verify program's capture) and give the CPU path's values bit for bit."""
    body, make_inputs, _ = CASES[op]
    inputs = make_inputs()
    expected = getattr(OPS, op)(**inputs)
    vocab = next(value for name, value in inputs.items() if name in ("logits", "weights", "target_weights")).shape[-1]
    monkeypatch.setattr(sampling, "ROW_BLOCK_ELEMENTS", 4 * vocab)
    rows_seen = []
    inner = getattr(speculative, blocked)
    monkeypatch.setattr(speculative, blocked, lambda first, *rest: rows_seen.append(len(first)) or inner(first, *rest))
    with forbid_host_sync():
        actual = body(**inputs)
    _assert_identical(actual, expected)
    assert len(rows_seen) > 1 and max(rows_seen) == 4


def test_row_blocks_leave_a_served_batch_whole():
    """Blocks are large (the row-wise scans slow down with fewer rows a launch): up to 440 rows of a
    152k vocabulary are one block; more rows are cut into blocks no smaller."""
    assert sampling.row_blocks(440, 151936) == [slice(0, 440)]
    assert sampling.row_blocks(256, 128256) == [slice(0, 256)]
    blocks = sampling.row_blocks(2048, 151936)
    assert len(blocks) > 1 and min(block.stop - block.start for block in blocks[:-1]) >= 440
