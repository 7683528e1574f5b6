"""Weights cut into several resources (`helios.ignition.sharding.WEIGHT_PART_NBYTES`) load side by
side (`helios.runtime.loading.weight_stream.load_weight_resources`) into exactly the tensors of a one-resource
core, whatever the thread count, and serve the same tokens; a bad part fails with its typed error."""

from __future__ import annotations

import pytest
import torch

import helios.ignition.export as export
import helios.ignition.sharding as sharding
from helios.core.keys import SigningKey
from helios.core.reader import open_core
from helios.ignition.capture_pool import capture_all
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core
from helios.runtime.loading import model as runtime_model
from helios.runtime.loading.model import rank_resource
from helios.runtime.offline import generate
from helios.runtime.service import build_runtime
from helios.runtime.loading.weight_stream import WantedTensor, WeightMismatchError, load_weight_resources
from ignition.hf_checkpoints import QWEN3
from support.chat_checkpoint import write_chat_checkpoint

NAMESPACE = "test.helios/parts"
PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13]]


@pytest.fixture(scope="module")
def cores(tmp_path_factory):
    """(one-resource core, several-part core, public key) of one checkpoint."""
    root = tmp_path_factory.mktemp("parts")
    checkpoint = write_chat_checkpoint(QWEN3, root / "checkpoint", seed=7)
    key = SigningKey.generate()
    # The programs only have to serve: one decode batch, no mixed step, no token-logprobs variants.
    options = PrepareOptions(NAMESPACE, capacities=CapacityPlan(context_tokens=64, prefill_tokens=16,
                                                                decode_batches=(2,), mixed=False,
                                                                token_logprobs=False))
    captured = []

    def recording(*args, **options):
        captured.extend(capture_all(*args, **options))
        return captured

    def replaying(arch, jobs, page_tokens, workers, on_captured, watched=None):
        assert len(jobs) == len(captured)
        for index, program in enumerate(captured):
            on_captured(index, program)
        return captured

    # One checkpoint and plan: the parts core's programs are the whole core's, captured once.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(export, "capture_all", recording)
        prepare_core(checkpoint, root / "whole.core", key, options)
        patch.setattr(export, "capture_all", replaying)
        patch.setattr(sharding, "WEIGHT_PART_NBYTES", 64 * 1024)
        prepare_core(checkpoint, root / "parts.core", key, options)
    return root / "whole.core", root / "parts.core", key.public


def opened(path, public):
    return open_core(path, accept=NAMESPACE, trusted_keys=[public])


def weight_ids(core) -> list[str]:
    return [info.id for info in core.resources if info.kind.name == "WEIGHTS"]


def test_parts_load_the_same_tensors_as_one_resource(cores):
    whole, parts = opened(cores[0], cores[2]), opened(cores[1], cores[2])
    assert weight_ids(whole) == ["weights.rank0"] and len(weight_ids(parts)) > 3
    assert weight_ids(parts)[1:] == [f"weights.rank0.part{k}" for k in range(1, len(weight_ids(parts)))]
    one = runtime_model._load_weights(whole, whole.prepared, torch.device("cpu"), 0)
    many = runtime_model._load_weights(parts, parts.prepared, torch.device("cpu"), 0)
    assert one.keys() == many.keys()
    assert all(torch.equal(one[name], many[name]) and one[name].dtype == many[name].dtype for name in one)


@pytest.mark.parametrize("workers", [1, 2, 5])
def test_thread_count_does_not_change_the_tensors(cores, workers):
    core = opened(cores[1], cores[2])
    wanted = {}
    for buffer in core.prepared.manifest.buffers:
        if buffer.resource_id:
            dtype = runtime_model._DTYPES[buffer.dtype]
            wanted.setdefault(buffer.resource_id, {})[buffer.name] = WantedTensor(dtype, tuple(d.size for d in buffer.shape))
    resources = {r: (core.resource(r).decoded_nbytes, names) for r, names in wanted.items()}
    serial = load_weight_resources(core.open_resource, resources, torch.device("cpu"), workers=1)
    parallel = load_weight_resources(core.open_resource, resources, torch.device("cpu"), workers=workers)
    assert serial.keys() == parallel.keys() and all(torch.equal(serial[n], parallel[n]) for n in serial)


def test_a_part_that_lacks_a_declared_tensor_fails_typed(cores):
    core = opened(cores[1], cores[2])
    ids = weight_ids(core)
    resources = {r: (core.resource(r).decoded_nbytes, {}) for r in ids}
    resources[ids[-1]] = (core.resource(ids[-1]).decoded_nbytes, {"w.absent": WantedTensor(torch.float32, (2,))})
    with pytest.raises(WeightMismatchError, match="lacks 'w.absent'"):
        load_weight_resources(core.open_resource, resources, torch.device("cpu"), workers=3)


def test_parts_serve_the_same_tokens(cores):
    tokens = []
    for path in cores[:2]:
        runtime = build_runtime(opened(path, cores[2]))
        try:
            tokens.append([list(r.token_ids) for r in generate(runtime.engine, PROMPTS, 5)])
        finally:
            runtime.close()
    assert tokens[0] == tokens[1] and all(len(t) == 5 for t in tokens[0])


class _Info:
    def __init__(self, id_, rank):
        self.id, self.rank, self.kind = id_, rank, "WEIGHTS"


class _Core:
    """The resource listing `rank_resource` reads."""

    def __init__(self, infos):
        self.resources = infos

    def resource(self, resource_id):
        return next(info for info in self.resources if info.id == resource_id)


def test_each_rank_part_maps_to_the_same_position_of_another_rank():
    ids = [("weights.rank0", 0), ("weights.rank0.part1", 0), ("weights.rank1", 1), ("weights.rank1.part1", 1)]
    core = _Core([_Info(i, r) for i, r in ids])
    assert rank_resource(core, "weights.rank0.part1", 1) == "weights.rank1.part1"
    assert rank_resource(core, "weights.rank0", 1) == "weights.rank1"
    assert rank_resource(core, "weights.rank1.part1", 1) == "weights.rank1.part1"
