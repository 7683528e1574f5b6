"""Shared packing of the example contract (examples/contract.json): every graph of it is packed by
the real packer, and the sources only speculative, mixed, scored or image-taking graphs receive
hold the values the table in `helios.contract.servable` promises."""

from __future__ import annotations

import json

import pytest
import torch

from contract.documents import example_doc
from helios.contract import PreparedContract
from helios.contract import manifest_pb2 as mpb
from helios.runtime.records.capacities import Operation
from helios.runtime.loading.model import _DTYPES
from helios.runtime.execution.host_staging import host_staging
from helios.runtime.execution.packer import Packer
from helios.runtime.records.request import RequestSpec
from helios.runtime.records.sampling_params import SamplingParams
from helios.runtime.records.plan import PlanRow, RowResult, StepPlan

STATE_ROWS = 2


@pytest.fixture(scope="module")
def prepared() -> PreparedContract:
    return PreparedContract.from_json(json.dumps(example_doc()))


def _buffers(prepared: PreparedContract) -> dict[str, torch.Tensor]:
    """The example's INPUT and persistent-state buffers on the host (the packer writes nothing
    else), with state rows for 8 slots."""
    out = {}
    for buffer in prepared.manifest.buffers:
        if buffer.role in (mpb.BUFFER_ROLE_INPUT, mpb.BUFFER_ROLE_PERSISTENT_STATE):
            shape = [dim.size if dim.WhichOneof("extent") == "size" else 8 * STATE_ROWS for dim in buffer.shape]
            out[buffer.name] = torch.zeros(shape, dtype=_DTYPES[buffer.dtype])
    return out


def _row(request_id: str, slot: int, tokens, start: int, samples: bool, admits: bool, ceiling: int = 1,
         sample_index: int = 0, constrained: bool = False) -> PlanRow:
    return PlanRow(request_id, slot, 3, tuple(tokens), False, start, len(tokens), 0, (), samples, sample_index,
                   ceiling if samples else 0, admits, constrained)


def _packer(prepared):
    buffers = _buffers(prepared)
    table = torch.randn(65536, 64).to(torch.bfloat16)
    staging = host_staging(prepared, {"w.engram": table}, buffers)
    packer = Packer(prepared, buffers, state_rows=STATE_ROWS, history_drafting=True, host_staging=staging)
    penalised = SamplingParams(seed=11, repetition_penalty=1.1)  # "a" has a prompt histogram written
    packer.register(RequestSpec("a", (5, 6, 7, 8), 16, frozenset({128001, 128009}), sampling=penalised))
    packer.register(RequestSpec("b", (9, 10, 11, 12, 13), 16, frozenset({128009}), sampling=SamplingParams(seed=12)))
    return packer, buffers


def _plan(operation: Operation, rows) -> StepPlan:
    return StepPlan(1, 0, operation, None, tuple(rows), (), sum(r.query_len for r in rows))


def test_prefill_admission_values_sampling_decisions_state_rows_and_padding(prepared):
    packer, buffers = _packer(prepared)
    rows = [_row("a", 2, (5, 6, 7, 8), 0, True, True), _row("b", 5, (9, 10, 11), 0, False, True)]
    packer.pack("prefill", _plan(Operation.PREFILL, rows))
    assert buffers["in.eos_ids"][2].tolist() == [128001, 128009, -1, -1]
    assert buffers["in.eos_ids"][5].tolist() == [128009, -1, -1, -1]
    assert buffers["in.state_rows"][:3].tolist() == [2 * STATE_ROWS, 5 * STATE_ROWS, -1]
    assert buffers["in.sampling_decisions"][:8].tolist() == [False, False, False, True, False, False, False, False]
    assert buffers["in.row_padding"].eq(-1).all()
    # No images: feature slots and context indices are padding.
    assert buffers["in.image_feature_slots"][:2].tolist() == [-1, -1]
    assert buffers["in.image_context_indices"][:7].eq(-1).all()


def test_mixed_binds_the_row_holding_the_prefill(prepared):
    packer, buffers = _packer(prepared)
    packer.pack("prefill", _plan(Operation.PREFILL, [_row("a", 2, (5, 6, 7, 8), 0, True, True)]))
    rows = [_row("a", 2, (40,), 4, True, False, sample_index=1), _row("b", 5, (9, 10, 11), 0, False, True)]
    packer.pack("mixed", _plan(Operation.MIXED, rows))
    assert buffers["in.mixed_prefill_row"].tolist() == [1]
    packer.pack("mixed", _plan(Operation.MIXED, rows[:1]))
    assert buffers["in.mixed_prefill_row"].tolist() == [-1]  # padding: no prefill row


def test_speculative_lanes_get_their_copied_generation_and_masks(prepared):
    packer, buffers = _packer(prepared)
    packer.register(RequestSpec("c", (1, 2, 3, 1, 2), 16, sampling=SamplingParams(seed=13)))
    packer.pack("prefill", _plan(Operation.PREFILL, [_row("c", 1, (1, 2, 3, 1, 2), 0, True, True)]))
    lanes = [_row("c", 1, (2,), 4, True, False, ceiling=4, sample_index=1),
             _row("a", 2, (8,), 3, True, True, ceiling=4, sample_index=1, constrained=True)]
    packer.pack("prefill", _plan(Operation.PREFILL, [_row("a", 2, (5, 6, 7, 8), 0, True, True)]))
    mask = torch.zeros(buffers["in.grammar_mask"].shape[1], dtype=torch.int32)
    mask[0] = 0b1010
    packer.pack("speculate_w4", _plan(Operation.SPECULATIVE, lanes).with_masks({"a": mask}))
    count = buffers["in.copied_counts"][:2].tolist()
    assert count[0] > 0 and count[1] == 0  # "c" repeats itself; the constrained lane takes no candidates
    assert buffers["in.copied_generations"][:2].tolist() == [3, 0]  # padding 0 without candidates
    masks = buffers["in.copied_masks"]
    assert masks[0].eq(-1).all() and masks[1, 1:].eq(-1).all()
    assert masks[1, 0, 0].item() == 0b1010 and masks[1, 0, 1:].eq(0).all()


def _rows_for(operation: int) -> list[PlanRow]:
    from helios.contract import serving_pb2 as spb

    prompt = [_row("a", 2, (5, 6, 7, 8), 0, True, True), _row("b", 5, (9, 10, 11), 0, False, True)]
    if operation in (spb.GRAPH_OPERATION_PREFILL, spb.GRAPH_OPERATION_SCORED_PREFILL,
                     spb.GRAPH_OPERATION_INITIALIZATION):
        return prompt
    lanes = [_row("a", 2, (40,), 4, True, True, ceiling=4, sample_index=1)]
    if operation == spb.GRAPH_OPERATION_MIXED:
        return lanes + prompt[1:]
    return lanes


def test_every_binding_of_every_packed_graph_of_the_example_is_written(prepared):
    """Shared packing supplies the whole example contract: each binding's destination is written
    (the host-table rows included) for a plan of its graph's operation."""
    from helios.contract import serving_pb2 as spb

    unpacked = (spb.GRAPH_OPERATION_VISION, spb.GRAPH_OPERATION_TUNING)  # written at load / by the feeder
    for name, graph in prepared.graphs.items():
        if graph.operation in unpacked:
            continue
        packer, buffers = _packer(prepared)
        for tensor in buffers.values():
            tensor.fill_(True if tensor.dtype == torch.bool else 77)
        packer.pack(name, _plan(Operation.PREFILL, _rows_for(graph.operation)))
        untouched = [b.destination for b in graph.bindings if b.buffer in buffers
                     and buffers[b.buffer].eq(True if buffers[b.buffer].dtype == torch.bool else 77).all()]
        assert untouched == [], name


def test_the_prompt_histogram_counts_sampled_ids_only(prepared):
    """An input-only id (the image placeholder, past the sampled vocabulary) has no histogram bin."""
    packer, buffers = _packer(prepared)
    sentinel = prepared.contract.model.input_vocabulary.image_sentinel_ids[0]
    assert sentinel >= buffers["in.prompt_histogram"].shape[1]
    packer.register(RequestSpec("img", (5, sentinel, sentinel, 5, 9), 16, frozenset({128009}),
                                sampling=SamplingParams(presence_penalty=0.5)))  # only penalties read it
    packer.pack("prefill", _plan(Operation.PREFILL, [_row("img", 3, (5, sentinel, sentinel, 5, 9), 0, True, True)]))
    row = buffers["in.prompt_histogram"][3].to(torch.int64)
    assert row.sum() == 3 and row[5] == 2 and row[9] == 1


def test_log_probability_requests_are_counted_through_registration(prepared):
    """`wants_logprobs` answers from a count of the recorded requests that ask (no row is looked
    at without one), kept right when an id is registered again or forgotten."""
    packer, _ = _packer(prepared)
    rows = (_row("a", 2, (40,), 4, True, False), _row("b", 5, (41,), 5, True, False))
    plan = _plan(Operation.DECODE, rows)
    assert not packer.wants_logprobs(plan)
    packer.register(RequestSpec("b", (9, 10), 16, top_logprobs=2))
    assert packer.wants_logprobs(plan)
    assert not packer.wants_logprobs(_plan(Operation.DECODE, rows[:1]))
    packer.register(RequestSpec("b", (9, 10), 16))  # the same id again, asking for none
    assert not packer.wants_logprobs(plan)
    packer.register(RequestSpec("a", (5, 6), 16, top_logprobs=0))
    packer.forget("a")
    packer.forget("a")
    assert not packer.wants_logprobs(plan) and packer._num_logprob_requests == 0


def test_logit_bias_rows_are_reset_to_padding_once_after_a_biased_request(prepared):
    """A slot's bias rows get the request's entries, padding after a biased request, and are left
    alone when they already hold padding the packer wrote (no fill per admission)."""
    packer, buffers = _packer(prepared)
    ids, values = buffers["in.logit_bias_ids"], buffers["in.logit_bias_values"]
    assert prepared.logit_bias_width == ids.shape[1] == values.shape[1]  # what admission holds a bias to
    assert prepared.eos_width == buffers["in.eos_ids"].shape[-1] > 1  # and a request's EOS ids
    packer.register(RequestSpec("biased", (5, 6), 16, frozenset({128009}), logit_bias=((7, 2.5),)))
    packer.pack("prefill", _plan(Operation.PREFILL, [_row("biased", 2, (5, 6), 0, True, True)]))
    assert ids[2, :2].tolist() == [7, -1] and values[2, :2].tolist() == [2.5, 0.0]
    packer.pack("prefill", _plan(Operation.PREFILL, [_row("b", 2, (9, 10), 0, True, True)]))
    assert ids[2].eq(-1).all() and values[2].eq(0).all()
    ids[2] = 123  # not the packer's write: a row it left padding is not written again
    packer.pack("prefill", _plan(Operation.PREFILL, [_row("a", 2, (5, 6), 0, True, True)]))
    assert ids[2].eq(123).all()
    packer.pack("prefill", _plan(Operation.PREFILL, [_row("biased", 2, (5, 6), 0, True, True)]))
    assert ids[2].tolist() == [7] + [-1] * (ids.shape[1] - 1)  # a biased request writes the whole row


def test_history_indexes_are_built_after_the_launch_or_when_first_read(prepared):
    """Registering a request leaves its history index for `index_histories` (the executor calls it
    once the program is launched); a read before that builds it, with the same candidates."""
    from helios.runtime.execution.history_drafting import HistoryIndex

    packer, _ = _packer(prepared)
    assert packer._histories == {} and packer._unindexed == {"a", "b"}
    packer.index_histories()
    assert set(packer._histories) == {"a", "b"} and not packer._unindexed
    packer.register(RequestSpec("c", (1, 2, 3, 1, 2), 16))
    lane = _row("c", 1, (2,), 4, True, False, ceiling=4, sample_index=1)
    assert packer.candidates(lane, 8) == HistoryIndex((1, 2, 3, 1, 2)).candidates(3) == (3, 1, 2)
    assert "c" not in packer._unindexed


def test_all_greedy_follows_the_recorded_requests(prepared):
    """Whether a plan's rows are all greedy, decided without looking at rows while no recorded
    request draws, and row by row once one does (registered again, forgotten, finished)."""
    packer, _ = _packer(prepared)
    plan = _plan(Operation.DECODE, [_row("a", 2, (5,), 4, True, False), _row("b", 5, (9,), 5, True, False)])
    assert packer.all_greedy(plan)
    packer.register(RequestSpec("c", (1, 2), 4, sampling=SamplingParams(temperature=0.7, seed=3)))
    assert packer.all_greedy(plan)  # "c" is recorded, but no row of the plan is its
    with_c = _plan(Operation.DECODE, [*plan.rows, _row("c", 1, (2,), 2, True, False)])
    assert not packer.all_greedy(with_c)
    packer.register(RequestSpec("c", (1, 2), 4))  # registered again, greedy now
    assert packer.all_greedy(with_c)
    packer.register(RequestSpec("b", (9,), 4, sampling=SamplingParams(temperature=1.0)))
    assert not packer.all_greedy(plan)
    packer.apply(StepPlan(2, 0, Operation.DECODE, None, (), (), 0, (), ("b",)))  # "b" finished
    assert packer._num_drawing_requests == 0 and packer.all_greedy(_plan(Operation.DECODE, plan.rows[:1]))


def test_a_readmitted_slots_output_counts_go_to_its_first_state_row():
    """With two state rows a request, slot s owns rows [2s, 2s + 2) of every per-row state view (the
    rows LIVE_STATE_ROWS names and an admission resets): the output counts a readmitted request gets
    back (its penalties' counts from before its preemption) go to row 2s, where the example's
    programs read them, not to row s, which is slot s / 2's."""
    doc = example_doc()
    views = doc["contract"]["model"]["state_views"]
    histograms = next(view for view in views if view["name"] == "histograms")
    views.append({**histograms, "name": "output_counts"})  # the view the runtime rebuilds counts into
    prepared = PreparedContract.from_json(json.dumps(doc))
    packer, buffers = _packer(prepared)
    counts = buffers["state.histograms"]
    first = _row("a", 1, (5, 6, 7, 8), 0, True, True)
    packer.observe(_plan(Operation.PREFILL, [first]), [RowResult(1, 3, 4, (40,), 4)])
    decode = _row("a", 1, (40,), 4, True, False, sample_index=1)
    packer.observe(_plan(Operation.DECODE, [decode]), [RowResult(1, 3, 5, (41,), 1)])
    readmitted = _row("a", 3, (5, 6, 7, 8, 40, 41), 0, True, True, sample_index=2)  # after a preemption, slot 3
    packer.pack("prefill", _plan(Operation.PREFILL, [readmitted]))
    row = 3 * STATE_ROWS
    assert counts[row, 40] == 1 and counts[row, 41] == 1 and counts[row].sum() == 2
    assert counts.sum() == 2  # no other row: slot 1's second row (row 3) among them
