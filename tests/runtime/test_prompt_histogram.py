"""Prompt histograms counted on the host (`helios.runtime.execution.prompt_histogram`): a penalised
request's row equals what the device bincount wrote before (`_bincount_row`, that code's formula),
on host rows, through the pinned rows a device row is copied from (reused across requests and
frames) and, on CUDA, in the device buffer itself; a request without a penalty skips the work."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from helios.contract import serving_pb2 as S
from helios.runtime.execution import pack_staging
from helios.runtime.execution.bindings import Binding
from helios.runtime.execution.pack_staging import Staging
from helios.runtime.execution.row_sources import fill_admission
from helios.runtime.execution.prompt_histogram import (ROWS_PER_FRAME, HistogramRows, prompt_counts,
                                                       write_host_row)
from helios.runtime.records.plan import PlanRow
from helios.runtime.records.request import RequestSpec
from helios.runtime.records.sampling_params import SamplingParams

BINS, SLOTS = 1000, 4
PENALTIES = (SamplingParams(repetition_penalty=1.2), SamplingParams(presence_penalty=0.5),
             SamplingParams(frequency_penalty=-0.3), SamplingParams(temperature=0.8, repetition_penalty=0.9))


def _bincount_row(tokens, bins: int, dtype: torch.dtype) -> torch.Tensor:
    """The row the device bincount wrote: ids below the bins counted, converted to the row's dtype."""
    ids = torch.tensor(tokens, dtype=torch.int64)
    ids = ids[ids < bins]
    return torch.bincount(ids, minlength=bins).to(dtype)


def _prompt(seed: int, length: int) -> tuple[int, ...]:
    generator = random.Random(seed)  # repeats, and ids past the bins (input-only ids)
    return tuple(generator.choice((generator.randrange(40), generator.randrange(BINS + 20))) for _ in range(length))


@pytest.mark.parametrize("dtype", [torch.int32, torch.uint16, torch.int64])
def test_a_host_row_equals_the_bincount_row(dtype):
    row = torch.full((BINS,), 9, dtype=dtype)
    for seed, length in ((1, 300), (2, 1), (3, 2048)):
        tokens = _prompt(seed, length)
        write_host_row(row, *prompt_counts(tokens, BINS))
        assert torch.equal(row, _bincount_row(tokens, BINS, dtype))
    write_host_row(row, *prompt_counts((BINS + 3,), BINS))  # nothing inside the bins: all zero
    assert row.eq(0).all()


def test_an_unsigned_row_wraps_as_the_conversion_does():
    tokens = (5,) * 70_000
    row = torch.zeros(BINS, dtype=torch.uint16)
    write_host_row(row, *prompt_counts(tokens, BINS))
    assert torch.equal(row, _bincount_row(tokens, BINS, torch.uint16)) and row[5] == 70_000 - 65_536


def test_a_negative_id_is_refused():
    with pytest.raises(ValueError, match="negative"):
        prompt_counts((3, -1), BINS)


def test_pinned_rows_reused_across_requests_and_frames_give_the_bincount_rows():
    """More admissions per frame than rows (the ring wraps), alternating frames: every copied row
    equals the bincount row, so the previous prompts' bins were cleared."""
    rows = HistogramRows(torch.zeros(BINS, dtype=torch.int32), pinned=False)
    seed = 0
    for frame in (0, 1, 0, 1, 0):
        rows.begin(frame)
        for _ in range(ROWS_PER_FRAME + 2):
            seed += 1
            tokens = _prompt(seed, 50 + 37 * seed)
            target = torch.full((BINS,), -5, dtype=torch.int32)
            rows.write(target, *prompt_counts(tokens, BINS))
            assert torch.equal(target, _bincount_row(tokens, BINS, torch.int32)), seed


def _device_staging():
    """Staging over a histogram buffer on ``meta`` (standing for a device: the staged path)."""
    buffers = {"hist": torch.zeros(SLOTS, BINS, dtype=torch.int32, device="meta")}
    view = SimpleNamespace(buffer="hist", destination="hist", source=S.VALUE_SOURCE_PROMPT_HISTOGRAM,
                           indexing=S.INDEXING_PHYSICAL_REQUEST_ROW, offset=0, padding=0, constant=0)
    staging = Staging(SimpleNamespace(graphs={"prefill": SimpleNamespace(bindings=[view])}), buffers, None)
    return staging, buffers, Binding("hist", "hist", view.source, view.indexing, 0, 0, 0)


def _admitting(slot: int, prompt) -> PlanRow:
    return PlanRow(f"r{slot}", slot, 1, tuple(prompt), False, 0, len(prompt), 0, (), True, 0, 1, True, False)


def test_a_device_row_is_one_copy_of_the_counts_for_penalised_requests_only(monkeypatch):
    written = []
    monkeypatch.setattr(HistogramRows, "write", lambda self, target, ids, counts: written.append((ids, counts)))
    staging, buffers, binding = _device_staging()
    staging.begin(0)
    prompt = _prompt(7, 500)
    for slot, sampling in enumerate((SamplingParams(), SamplingParams(temperature=0.7), *PENALTIES[:2])):
        spec = RequestSpec("r", prompt, 4, sampling=sampling)
        fill_admission(binding, buffers["hist"], _admitting(slot, prompt), spec, staging)
    assert len(written) == 2  # the two penalised requests
    for ids, counts in written:
        row = torch.zeros(BINS, dtype=torch.int64)
        row[torch.from_numpy(ids)] = torch.from_numpy(counts)
        assert torch.equal(row, _bincount_row(prompt, BINS, torch.int64))


def test_requests_without_a_penalty_count_nothing(monkeypatch):
    def refuse(tokens, bins):
        raise AssertionError("a request without a penalty counted its prompt")

    monkeypatch.setattr(pack_staging, "prompt_counts", refuse)
    staging, buffers, binding = _device_staging()
    host = torch.full((SLOTS, BINS), 3, dtype=torch.int32)
    staging.begin(0)
    prompt = _prompt(8, 64)
    for sampling in (SamplingParams(), SamplingParams(temperature=1.0, top_k=5, seed=4)):
        spec = RequestSpec("r", prompt, 4, sampling=sampling)
        fill_admission(binding, buffers["hist"], _admitting(1, prompt), spec, staging)
        fill_admission(binding, host, _admitting(1, prompt), spec, staging)
    assert host.eq(3).all()  # the host row was left as it was


def test_penalised_is_any_penalty_off_neutral():
    assert not SamplingParams().penalised and not SamplingParams(temperature=2.0, top_p=0.5).penalised
    assert all(params.penalised for params in PENALTIES)
    assert SamplingParams(repetition_penalty=float("nan")).penalised


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_rows_equal_the_bincount_rows_without_a_blocking_copy():
    """Admissions of two frames, more per frame than pinned rows, into a CUDA buffer: every row
    equals the bincount row once the stream has run the copies."""
    device = torch.device("cuda")
    buffers = {"hist": torch.full((2 * ROWS_PER_FRAME + 2, BINS), -1, dtype=torch.int32, device=device)}
    view = SimpleNamespace(buffer="hist", destination="hist", source=S.VALUE_SOURCE_PROMPT_HISTOGRAM,
                           indexing=S.INDEXING_PHYSICAL_REQUEST_ROW, offset=0, padding=0, constant=0)
    staging = Staging(SimpleNamespace(graphs={"prefill": SimpleNamespace(bindings=[view])}), buffers, None)
    binding = Binding("hist", "hist", view.source, view.indexing, 0, 0, 0)
    expected = {}
    slot = 0
    for frame, count in ((0, ROWS_PER_FRAME + 2), (1, ROWS_PER_FRAME)):
        staging.begin(frame, frame)
        for _ in range(count):
            prompt = _prompt(100 + slot, 2048)
            fill_admission(binding, buffers["hist"], _admitting(slot, prompt),
                            RequestSpec("r", prompt, 4, sampling=PENALTIES[0]), staging)
            expected[slot] = _bincount_row(prompt, BINS, torch.int32)
            slot += 1
        torch.cuda.synchronize()
    for slot, row in expected.items():
        assert torch.equal(buffers["hist"][slot].cpu(), row), slot
