"""The committed prepared-model fixture still loads and generates the recorded tokens (no re-export
after engine upgrades), and cores whose manifest is inconsistent fail at load with a clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helios.contract import PreparedContract, manifest_pb2
from helios.core.keys import load_signing_key
from helios.core.reader import open_core
from helios.core.writer import CoreWriter
from helios.errors import LoadError
from helios.runtime.loading.model import MissingVariantError, WeightMismatchError
from helios.runtime.offline import generate
from helios.runtime.service import build_runtime

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CORE = FIXTURES / "models" / "tiny_qwen3.core"
EXPECTED = json.loads((FIXTURES / "models" / "tiny_qwen3.json").read_text())
KEY = FIXTURES / "cores" / "TEST-ONLY-signing.key"
NAMESPACE = EXPECTED["namespace"]


def open_fixture(path: Path = CORE):
    return open_core(path, accept=NAMESPACE, trusted_keys=[Path(str(KEY) + ".pub")])


def test_fixture_core_generates_the_recorded_tokens():
    runtime = build_runtime(open_fixture())
    results = generate(runtime.engine, EXPECTED["prompts"], EXPECTED["max_tokens"])
    assert [list(r.token_ids) for r in results] == EXPECTED["token_ids"]


def rewrite(tmp_path: Path, edit) -> Path:
    """A copy of the fixture core whose manifest `edit(manifest)` changed, re-signed with the test key."""
    source = open_fixture()
    contract_bytes, manifest_bytes = source.prepared.encode()
    manifest = manifest_pb2.ExecutionManifest.FromString(manifest_bytes)
    edit(manifest)
    writer = CoreWriter()
    for info in source.resources:
        writer.add_resource(info.id, info.kind, source.read_resource(info.id), rank=info.rank)
    writer.set_contract(PreparedContract.decode(contract_bytes, manifest.SerializeToString()))
    writer.set_publisher(NAMESPACE)
    writer.add_signing_key(load_signing_key(KEY))
    target = tmp_path / "edited.core"
    writer.write(target)
    return target


def drop_decode(manifest):
    keep = [h for h in manifest.graph_handles if h.graph != "decode"]
    del manifest.graph_handles[:]
    manifest.graph_handles.extend(keep)


def test_missing_decode_variant_fails_at_load(tmp_path):
    def edit(manifest):
        drop_decode(manifest)
        catalog = [c for c in manifest.execution_catalog if c.graph != "decode"]
        del manifest.execution_catalog[:]
        manifest.execution_catalog.extend(catalog)

    # The contract still declares the decode graph, so the contract check itself refuses it.
    with pytest.raises(Exception) as caught:
        rewrite(tmp_path, edit)
    assert "decode" in str(caught.value)


def test_op_schema_mismatch_fails_at_load(tmp_path):
    def edit(manifest):
        for op in manifest.abi_operations:
            if op.name == "helios::sample":
                op.schema = op.schema.replace("Tensor mask_rows", "Tensor rows")

    with pytest.raises(LoadError, match="helios::sample"):
        build_runtime(open_fixture(rewrite(tmp_path, edit)))


def test_declared_but_unused_op_does_not_block_loading(tmp_path):
    def edit(manifest):
        manifest.abi_operations.add(name="helios::not_an_op", schema="(Tensor x) -> Tensor")
        for handle in manifest.graph_handles:
            handle.abi_operations.append("helios::not_an_op")

    # Declared but never called by the programs: loading succeeds; a program calling an
    # unregistered op is caught by validate_serialized_ops (tests/abi/test_registry.py).
    build_runtime(open_fixture(rewrite(tmp_path, edit)))


def test_weight_shape_disagreeing_with_manifest_fails_at_load(tmp_path):
    def edit(manifest):
        weight = next(b for b in manifest.buffers if b.role == manifest_pb2.BUFFER_ROLE_WEIGHT)
        weight.shape[0].size += 1

    with pytest.raises(WeightMismatchError, match="manifest declares"):
        build_runtime(open_fixture(rewrite(tmp_path, edit)))


def test_manifest_without_program_io_fails_at_load(tmp_path):
    def edit(manifest):
        for handle in manifest.graph_handles:
            del handle.program_inputs[:]

    with pytest.raises(MissingVariantError, match="inputs/outputs"):
        build_runtime(open_fixture(rewrite(tmp_path, edit)))


def test_fixture_core_has_a_servable_frontend():
    from tokenizers import Tokenizer

    from helios.frontend.session import FrontendModel

    model = build_runtime(open_fixture()).model
    tokenizer = Tokenizer.from_str(model.tokenizer_json.decode("utf-8"))
    frontend = FrontendModel.from_contract(model.prepared, tokenizer, model.chat_template)
    assert frontend.served_id == "fixture/tiny-qwen3"


def test_host_staged_packing_generates_the_same_tokens():
    """Packing through host mirrors (what a CUDA model does) equals packing in place; a grammar-free
    workload keeps the staged masks all-allowed after the first upload."""
    model = build_runtime(open_fixture()).model
    results = generate(_engine(model, staged=True), EXPECTED["prompts"], EXPECTED["max_tokens"])
    assert [list(r.token_ids) for r in results] == EXPECTED["token_ids"]
    masks = [name for name in model.buffers if "grammar" in name or "mask" in name]
    assert masks and all(bool((model.buffers[name] == -1).all()) for name in masks)


def _engine(model, graphs: bool = False, **packer_options):
    """An engine on `model`; `graphs`: on a `GraphExecutor` (programs that replay captured graphs)."""
    from helios.runtime.engine import Engine
    from helios.runtime.execution.executor import Executor, GraphExecutor
    from helios.runtime.execution.program_variants import program_table
    from helios.runtime.execution.geometry import capacities_for
    from helios.runtime.execution.packer import Packer
    from helios.runtime.scheduling.scheduler import Scheduler
    from helios.runtime.records.stats import WorkerStats

    packer = Packer(model.prepared, model.buffers, max(1, model.prepared.state_rows_per_request()), **packer_options)
    kind = GraphExecutor if graphs else Executor
    return Engine(Scheduler.create(capacities_for(model, 16, 0)), kind(model, packer, program_table(model)),
                  WorkerStats())


def test_executor_replays_the_greedy_graph_only_when_no_row_samples():
    """A captured program (CUDA graphs) is replayed with greedy=True exactly for the steps in which
    no request has temperature > 0; here a recording stand-in plays the captured program on the CPU."""
    import dataclasses

    from helios.runtime.loading.cuda_graphs import CapturedProgram
    from helios.runtime.loading.model import program_arguments
    from helios.runtime.records.sampling_params import SamplingParams

    model = build_runtime(open_fixture()).model
    seen: list[bool] = []

    class Recording(CapturedProgram):
        def __init__(self, program):
            self.module, self.arguments = program.module, program_arguments(program, model.weights, model.buffers)

        def replay(self, greedy: bool, fresh: bool = False):
            seen.append(greedy)
            return self.module(*self.arguments)

    model = dataclasses.replace(model, programs=tuple(dataclasses.replace(p, module=Recording(p)) for p in model.programs))
    results = generate(_engine(model, graphs=True), EXPECTED["prompts"], EXPECTED["max_tokens"])
    assert [list(r.token_ids) for r in results] == EXPECTED["token_ids"]
    assert seen and all(seen)
    seen.clear()
    sampled = SamplingParams.from_packed((0.7, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0), seed=3)
    generate(_engine(model, graphs=True), EXPECTED["prompts"][:1], 4, sampling=sampled)
    assert seen and not any(seen)


def test_prompt_histogram_counts_a_prefix_served_from_the_cache():
    """The prompt histogram (repetition penalties read it) counts the whole prompt at admission,
    also the part whose pages came from the prefix cache (that row starts past it); a request
    without a penalty leaves it alone (nothing reads it then)."""
    import torch

    from helios.contract import serving_pb2
    from helios.runtime.records.sampling_params import SamplingParams

    prompt = [(i * 37) % 300 + 3 for i in range(40)]
    runtime = build_runtime(open_fixture())
    bindings = [b for g in runtime.model.prepared.graphs.values() for b in g.bindings]
    name = next(b.buffer for b in bindings if b.source == serving_pb2.VALUE_SOURCE_PROMPT_HISTOGRAM)
    expected = torch.bincount(torch.tensor(prompt), minlength=runtime.model.buffers[name].shape[1])
    histogram = runtime.model.buffers[name]
    penalised = SamplingParams(repetition_penalty=1.2)
    for _ in range(2):  # the second request finds 32 of its 40 tokens in the prefix cache
        histogram.zero_()
        generate(runtime.engine, [prompt], 1, sampling=penalised)
        (slot,) = histogram.sum(dim=1).nonzero().flatten().tolist()  # the row of the admitted slot
        assert torch.equal(histogram[slot].to(torch.int64), expected)
    histogram.fill_(7)
    generate(runtime.engine, [prompt], 1)  # greedy, no penalty: the row is not written
    assert histogram.eq(7).all()
