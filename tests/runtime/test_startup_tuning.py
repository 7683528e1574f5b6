"""Startup tuning producers end to end on the CPU: a prepared core declares `tune_attention` and the
DECODE graph's tuned binding, loading runs the producer before the model is returned, DECODE
programs read their own entry, and a missing or failing producer fails startup with its typed error."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from helios.abi.attention import DECODE_PROGRAMS_PER_MULTIPROCESSOR
from helios.contract import PreparedContract
from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb
from helios.core.reader import open_core
from helios.errors import ContractError
from helios.ignition.capture import capture_program
from helios.ignition.program_spec import AttentionTuning, Operation, ProgramOptions
from helios.ignition.recipes import load_checkpoint
from helios.ignition.tuning import TUNING_CAPACITY, TUNING_GRAPH
from helios.runtime.loading.model import load_model
from helios.runtime.offline import generate
from helios.runtime.service import build_runtime
from helios.runtime.loading.tuning import MissingProducerError, ProducerFailedError, TuningProducerError
from ignition.hf_checkpoints import QWEN3
from support.server_core import NAMESPACE, tiny_core

# The server tests' tiny Qwen3 core (prepared once per run), whose plan these are.
CONTEXT_TOKENS, DECODE_ROWS, THREADS = 256, (1, 4, 8), 6
PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13]]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    core = tiny_core(tmp_path_factory.getbasetemp())
    return core.path.parent / "checkpoint", core.path, core.public_key


def open_prepared(prepared):
    _, path, public = prepared
    return open_core(path, accept=NAMESPACE, trusted_keys=[public])


@contextlib.contextmanager
def threads(count: int):
    """helios::device_multiprocessors reports torch's thread count on the CPU."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def expected_splits(multiprocessors: int, num_kv_heads: int) -> list[int]:
    """The documented formula, written independently of the producer's tensor ops."""
    ceiling = min(64, math.ceil(CONTEXT_TOKENS / 128))
    return [max(1, min(math.ceil(DECODE_PROGRAMS_PER_MULTIPROCESSOR * multiprocessors / (rows * num_kv_heads)), ceiling)) for rows in DECODE_ROWS]


def test_prepared_contract_declares_the_producer_and_the_decode_binding(prepared):
    contract = open_prepared(prepared).prepared
    again = PreparedContract.decode(*contract.encode())  # validates every rule, tuned bindings included
    manifest = again.manifest
    graphs = {g.name: g for g in again.contract.model.graphs}
    assert graphs[TUNING_GRAPH].operation == spb.GRAPH_OPERATION_TUNING
    decodes = ("decode", "decode_logprobs")  # the token-logprobs variant reads the same split counts
    for name in decodes:
        assert [(t.buffer, t.producer) for t in graphs[name].tuned_bindings] == [("attention_splits", TUNING_GRAPH)]
    assert all(not g.tuned_bindings for name, g in graphs.items() if name not in decodes)
    assert [(e.graph, list(e.outputs)) for e in manifest.tuning_catalog] == [(TUNING_GRAPH, ["attention_splits"])]
    assert TUNING_GRAPH not in {e.graph for e in manifest.execution_catalog}
    splits = next(b for b in manifest.buffers if b.name == "attention_splits")
    assert splits.role == mpb.BUFFER_ROLE_PERSISTENT_STATE and [d.size for d in splits.shape] == [len(DECODE_ROWS)]
    ops = {h.graph: set(h.abi_operations) for h in manifest.graph_handles}
    assert "helios::paged_attention_tuned" in ops["decode"] and "helios::paged_attention" not in ops["decode"]
    assert "helios::paged_attention" in ops["prefill"] and "helios::paged_attention_tuned" not in ops["prefill"]
    assert ops[TUNING_GRAPH] == {"helios::device_multiprocessors"}
    declared = {op.name for op in manifest.abi_operations}
    assert {"helios::paged_attention_tuned", "helios::device_multiprocessors", "helios::paged_attention"} <= declared


def test_loading_runs_the_producer_with_the_formula_of_this_cpu(prepared):
    core = open_prepared(prepared)
    with threads(THREADS):
        model = load_model(core)
    num_kv_heads = QWEN3.config().num_key_value_heads
    assert expected_splits(THREADS, num_kv_heads) == [2, 2, 1]  # the context ceiling and the row count both bite
    assert model.buffers["attention_splits"].tolist() == expected_splits(THREADS, num_kv_heads)


def test_tuned_outputs_are_the_buffers_capture_must_keep(prepared):
    """CUDA capture zeroes the buffers its warm-up may have written, except the producers' outputs."""
    from helios.runtime.loading.model import tuned_outputs

    assert tuned_outputs(open_prepared(prepared).prepared) == {"attention_splits"}


def test_each_decode_program_reads_its_own_entry(prepared):
    model = load_model(open_prepared(prepared))
    decode = [p for p in model.programs if p.operation == spb.GRAPH_OPERATION_DECODE]
    for twins in (False, True):  # the plain programs and their token-logprobs variants
        assert sorted(p.batch_capacity for p in decode if bool(p.token_logprobs) is twins) == list(DECODE_ROWS)
    for program in decode:
        assert "attention_splits" in program.inputs
        index = DECODE_ROWS.index(program.batch_capacity)
        nodes = program.module.graph.nodes
        slices = [n.args[1:] for n in nodes if n.op == "call_function" and "slice" in str(n.target)
                  and getattr(n.args[0], "name", "") == "attention_splits"]
        assert slices == [(0, index, index + 1)]
        tuned = [n for n in nodes if "paged_attention_tuned" in str(n.target)]
        assert len(tuned) == QWEN3.config().num_hidden_layers


def test_split_counts_are_a_schedule_decode_gives_the_same_tokens(prepared):
    runtime = build_runtime(open_prepared(prepared))
    first = [list(r.token_ids) for r in generate(runtime.engine, PROMPTS, 6)]
    runtime.model.buffers["attention_splits"].copy_(torch.tensor([64, 7, 3], dtype=torch.int32))
    second = [list(r.token_ids) for r in generate(runtime.engine, PROMPTS, 6)]
    assert second == first and all(len(tokens) == 6 for tokens in first)


class _Core:
    """A verified core with its prepared contract or one resource replaced (what an older or
    broken runtime-side view would hand to load_model; the contract check itself refuses both)."""

    def __init__(self, core, prepared=None, resources=None):
        self._core, self.prepared, self._resources = core, prepared or core.prepared, resources or {}

    def read_resource(self, resource_id):
        return self._resources.get(resource_id) or self._core.read_resource(resource_id)

    def __getattr__(self, name):
        return getattr(self._core, name)


class _Prepared:
    def __init__(self, prepared, manifest):
        self._prepared, self.manifest = prepared, manifest

    def __getattr__(self, name):
        return getattr(self._prepared, name)


def test_a_manifest_without_the_producer_fails_the_contract_check_and_startup(prepared):
    core = open_prepared(prepared)
    contract_bytes, manifest_bytes = core.prepared.encode()
    manifest = mpb.ExecutionManifest.FromString(manifest_bytes)
    del manifest.tuning_catalog[:]
    with pytest.raises(ContractError, match=TUNING_GRAPH):
        PreparedContract.decode(contract_bytes, manifest.SerializeToString())
    with pytest.raises(MissingProducerError, match=TUNING_GRAPH) as caught:
        load_model(_Core(core, _Prepared(core.prepared, manifest)))
    assert isinstance(caught.value, TuningProducerError)


def test_a_failing_producer_fails_startup(prepared):
    checkpoint, _, _ = prepared
    core = open_prepared(prepared)
    arch = load_checkpoint(checkpoint).architecture
    wrong = AttentionTuning((1, 2, 4, 8), CONTEXT_TOKENS)  # fills four entries; the buffer holds three
    captured = capture_program(arch, Operation.TUNING, TUNING_CAPACITY, 16, ProgramOptions(attention_tuning=wrong))
    (handle,) = [h for h in core.prepared.manifest.graph_handles if h.graph == TUNING_GRAPH]
    with pytest.raises(ProducerFailedError, match=TUNING_GRAPH):
        load_model(_Core(core, resources={handle.resource_id: captured.program}))
