"""Captured programs: the calling convention, what the saved bytes hold, the ABI ops they declare,
and proof that a decode step writes caches and state in place without copying them."""

from __future__ import annotations


import contextlib

import pytest
import torch
import torch.fx.config
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from helios.abi.program_image import decode_program
from helios.abi.registry import serialized_program_ops, validate_program_ops, validate_serialized_ops
from helios.ignition.architecture import CheckpointError
from helios.ignition.program_spec import Access, Capacity, InputRole, Operation, program_spec
from helios.ignition.window_split import WINDOW_INPUTS, full_layers, sliding_layers

from .conftest import ALL_OPERATIONS
from .driver import PagedModel, RowWork, Sequence
from .hf_checkpoints import QWEN2

STATE = ("weights", "k_cache", "v_cache", "output_counts")
ROW_INPUTS = ("prompt_counts", "page_table")
STEP = ("token_ids", "positions", "query_lens", "request_slots", "generations", "sample_rows", "seeds",
        "counters", "sampling_params", "grammar_mask", "logit_bias_ids", "logit_bias_values", "submission")
ABI_OPS = {"helios::rotary_cache_write", "helios::paged_attention", "helios::sample", "helios::completion_record",
           "helios::rms_norm", "helios::add_rms_norm", "helios::silu_mul"}


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(QWEN2, ALL_OPERATIONS)  # q/k/v bias, tied embeddings, one sliding-window layer


def exported(captured) -> torch.export.ExportedProgram:
    return decode_program(captured.program)


def test_inputs_and_outputs_follow_the_calling_convention(prepared):
    arch = prepared.recipe.architecture
    for operation, captured in prepared.captured.items():
        spec = captured.spec
        scored = operation is Operation.SCORED_PREFILL
        extra = ("target_ids",) if scored else ("pending_ids",) if operation is Operation.MIXED else ()
        # Its sliding layer keeps a region of its own page ids (helios.ignition.window_split), last.
        assert spec.input_names == STATE + ROW_INPUTS + STEP + extra + WINDOW_INPUTS
        scores = ("token_logprob", "top_token_ids", "top_token_logprobs",  # the sampled token's, then the targets'
                  "target_logprobs", "target_top_ids", "target_top_logprobs")
        assert spec.output_names == ("completion", "logits") + (scores if scored else ())
        inputs = {s.name: s for s in spec.inputs}
        assert len(full_layers(arch)) == arch.num_layers - 1 and len(sliding_layers(arch)) == 1
        assert inputs["k_cache"].shape == (arch.num_layers - 1, "pages", 4, arch.num_kv_heads, arch.head_dim)
        assert inputs["window_v_cache"].shape == (1, "window_pages", 4, arch.num_kv_heads, arch.head_dim)
        assert inputs["window_page_table"].shape == ("request_rows", "max_pages")
        assert (inputs["k_cache"].role, inputs["k_cache"].access) == (InputRole.CACHE_STORAGE, Access.READ_WRITE)
        assert (inputs["output_counts"].role, inputs["output_counts"].access) == \
            (InputRole.PERSISTENT_STATE, Access.READ_WRITE)
        assert inputs["prompt_counts"].access is Access.READ
        assert inputs["page_table"].shape == ("request_rows", "max_pages")
        assert inputs["grammar_mask"].shape == (spec.capacity.batch_capacity, 4)
        assert inputs["sampling_params"].shape == (spec.capacity.batch_capacity, 7)
        assert all(inputs[name].role is InputRole.STEP_INPUT for name in ROW_INPUTS + STEP + extra + WINDOW_INPUTS[2:])
        assert [slot.name for slot in spec.weights] == [w.name for w in prepared.recipe.weights]


def test_decode_variants_need_one_token_per_row(prepared):
    arch = prepared.recipe.architecture
    with pytest.raises(CheckpointError, match="T == R"):
        program_spec(arch, Operation.DECODE, Capacity(2, 4), 4)
    with pytest.raises(CheckpointError, match="batch_capacity"):
        Capacity(4, 2)


def test_saved_programs_hold_no_weights_and_no_example_inputs(prepared):
    for captured in prepared.captured.values():
        program = exported(captured)
        assert program.example_inputs is None
        assert not program.state_dict
        assert sum(t.numel() for t in program.constants.values() if isinstance(t, torch.Tensor)) == 0
        kinds = {spec.kind for spec in program.graph_signature.input_specs}
        assert kinds == {torch.export.graph_signature.InputKind.USER_INPUT}


def test_programs_trace_without_stack_traces_and_store_the_same_bytes(prepared, monkeypatch):
    """Each node's Python stack trace cost about 15% of a preparation and `encode_program` drops it: the
    export runs with torch's switch on (torch 2.13; 2.11 has none), restores it, and stores the bytes a
    traced export stores."""
    from helios.abi.program_image import encode_program
    from helios.ignition import capture

    arch = prepared.recipe.architecture
    decode = prepared.captured[Operation.DECODE]
    switch = hasattr(torch.fx.config, "do_not_emit_stack_traces")
    _, quiet = capture.export_program(arch, Operation.DECODE, decode.spec.capacity, 4)
    assert not switch or not torch.fx.config.do_not_emit_stack_traces  # restored
    monkeypatch.setattr(capture._STACK_TRACES, "off", contextlib.nullcontext)
    _, traced = capture.export_program(arch, Operation.DECODE, decode.spec.capacity, 4)

    def ours(program):  # nodes whose stack trace names the programs' own modules (torch's passes add a few of theirs)
        return [node for node in program.graph.nodes if "helios" in (node.meta.get("stack_trace") or "")]

    assert len(ours(traced)) > 20, "the traced export records stack traces"
    assert switch == (not ours(quiet))
    assert encode_program(quiet) == encode_program(traced) == decode.program


def test_programs_declare_the_abi_ops_they_call(prepared):
    for captured in prepared.captured.values():
        declared = dict(captured.spec.abi_ops)
        scored = captured.spec.operation is Operation.SCORED_PREFILL  # it scores the sampled token too
        expected = ABI_OPS | ({"helios::token_logprobs"} if scored else set())
        assert set(declared) == expected
        assert serialized_program_ops(captured.program) == expected
        validate_serialized_ops(captured.program, declared)
        validate_program_ops(exported(captured), declared)


def test_decode_graph_only_touches_caches_through_views_and_abi_ops(prepared):
    program = exported(prepared.captured[Operation.DECODE])
    signature = program.graph_signature
    assert not signature.user_inputs_to_mutate and not signature.buffers_to_mutate  # no write-back copies
    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    for name in ("k_cache", "v_cache"):
        planes = list(placeholders[name].users)
        assert planes and {str(node.target) for node in planes} == {"aten.select.int"}
        consumers = {str(user.target) for plane in planes for user in plane.users}
        assert consumers == {"helios.rotary_cache_write.default", "helios.paged_attention.default"}
    state_users = {str(node.target) for node in placeholders["output_counts"].users}
    assert not signature.user_inputs_to_mutate
    assert state_users == {"aten.index.Tensor", "aten.index_put_.default"}  # row gather, in-place count


class _AllocationLog(TorchDispatchMode):
    """Records every op and the size of every output that does not alias an input's storage."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []
        self.new_bytes: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        self.ops.append(str(func))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().data_ptr() not in inputs:
                self.new_bytes.append(tensor.untyped_storage().nbytes())
        return out


def test_decode_step_writes_cache_and_counts_in_place_without_copies(prepared):
    model = PagedModel(prepared.recipe.weight_tensors, prepared.programs)
    sequence = Sequence(2, [5, 9, 11, 3, 7, 1])
    model.admit(sequence, 6)
    model.run(Operation.PREFILL, [RowWork(sequence, tuple(sequence.token_ids), 0, sample=False)])
    pointers = {name: tensor.data_ptr() for name, tensor in model.state.items()}
    before = {name: tensor.clone() for name, tensor in model.state.items()}
    log = _AllocationLog()
    with log:
        outputs = model.run(Operation.DECODE, [RowWork(sequence, (4,), 6, sample=True)])
    token = outputs["sampled_ids"][0].item()
    assert "helios.rotary_cache_write.default" in log.ops and "aten.index_put_.default" in log.ops
    plane_bytes = model.state["k_cache"][0].nbytes
    assert max(log.new_bytes) < plane_bytes // 8  # nothing near the size of one cache plane
    assert {name: tensor.data_ptr() for name, tensor in model.state.items()} == pointers
    page, offset = sequence.pages[6 // 4], 6 % 4
    window_page = sequence.window_pages[6 // 4]  # the sliding layer's own page id of that position
    for names, page_id in ((("k_cache", "v_cache"), page), (("window_k_cache", "window_v_cache"), window_page)):
        for name in names:
            changed = (model.state[name] != before[name]).any(dim=(3, 4))  # [layers, pages, page_tokens]
            layers = model.state[name].shape[0]  # one full layer, one sliding layer
            assert changed.nonzero().tolist() == [[layer, page_id, offset] for layer in range(layers)]
    counts = model.state["output_counts"] - before["output_counts"]
    assert counts.nonzero().tolist() == [[2, token]] and counts[2, token] == 1
    assert torch.equal(model.state["prompt_counts"], before["prompt_counts"])
    assert torch.equal(model.state["page_table"], before["page_table"])


def test_symbolic_dims_take_any_extent_after_capture(prepared):
    results = []
    for pages, max_pages, slots in ((1, 1, 1), (300, 40, 9)):
        model = PagedModel(prepared.recipe.weight_tensors, prepared.programs,
                           num_pages=pages, max_pages=max_pages, num_slots=slots)
        sequence = Sequence(0, [3, 1, 4])
        model.admit(sequence, 3)
        outputs = model.run(Operation.PREFILL, [RowWork(sequence, (3, 1, 4), 0, sample=True)])
        results.append(outputs["logits"])
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)
