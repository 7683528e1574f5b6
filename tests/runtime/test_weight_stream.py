"""Weights decode straight into their tensors with every check kept: the same tensors as the
whole-resource safetensors path, on the direct (CPU) and the staged (device) path, a malformed or
mismatching header fails before any tensor byte is read, and a tampered chunk of the committed
fixture's weights fails `load_model` with the core's typed error."""

from __future__ import annotations

import hashlib
import io
import json
import shutil

import pytest
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from helios.core.errors import ChunkDigestError, DecodedLengthError
from helios.ignition.safetensors_image import safetensors_image
from helios.runtime.loading.model import LoadOptions, load_model
from helios.runtime.loading.weight_stream import (
    HostFiller,
    StagedCopier,
    WantedTensor,
    WeightMismatchError,
    load_safetensors_stream,
)

from .test_model_fixture import CORE, open_fixture

TENSORS = {
    "w.a": torch.arange(12, dtype=torch.float32).reshape(3, 4),
    "w.b": (torch.arange(37) / 7).to(torch.bfloat16),
    "w.c": torch.tensor([5], dtype=torch.int64),
    "w.empty": torch.zeros(0, 4, dtype=torch.float16),
    "w.scalar": torch.tensor(2.5),
}


def _wanted(names) -> dict[str, WantedTensor]:
    return {name: WantedTensor(TENSORS[name].dtype, tuple(TENSORS[name].shape)) for name in names}


def _load(data: bytes, wanted, filler):
    return load_safetensors_stream(io.BytesIO(data), len(data), "weights.rank0", wanted, filler)


@pytest.mark.parametrize("make_filler", [HostFiller, lambda: StagedCopier(torch.device("cpu"), 16, 2)])
@pytest.mark.parametrize("names", [list(TENSORS), ["w.b", "w.scalar"], []])
def test_streamed_tensors_equal_the_whole_file_path(make_filler, names):
    data = save_safetensors(TENSORS)
    loaded = _load(data, _wanted(names), make_filler())
    reference = load_safetensors(data)
    assert sorted(loaded) == sorted(names)
    for name in names:
        assert loaded[name].dtype == reference[name].dtype and torch.equal(loaded[name], reference[name])


def test_the_writer_image_is_the_safetensors_file():
    tensors = {**TENSORS, "w.ü": torch.ones(3, dtype=torch.int32), "w.t": torch.arange(6.0).reshape(2, 3).t()}
    expected = save_safetensors({name: t.contiguous() for name, t in tensors.items()})
    image = safetensors_image(tensors)
    assert image.to_bytes() == expected and image.nbytes == len(expected)
    assert image.sha256() == hashlib.sha256(expected).digest()


def _with_header(header: dict, body: bytes) -> bytes:
    text = json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text + body


@pytest.mark.parametrize("header, body", [
    ({"w.a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, bytes(9)),   # a byte left over
    ({"w.a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, bytes(7)),   # a byte short
    ({"w.a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8)),   # range does not fit shape
    ({"w.a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, bytes(8)),   # gap
    ({"w.a": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 8]}}, bytes(8)),    # unknown dtype
    ({"w.a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, bytes(8)),  # negative extent
    ({"w.a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "w.b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12)),  # overlap
    ([1, 2], bytes(0)),                                                           # not an object
])
def test_malformed_headers_fail_typed(header, body):
    data = _with_header(header, body)
    with pytest.raises(WeightMismatchError):
        _load(data, {}, HostFiller())


def test_a_header_longer_than_the_resource_fails_typed():
    data = (10**6).to_bytes(8, "little") + b"{}"
    with pytest.raises(WeightMismatchError, match="header claims"):
        _load(data, {}, HostFiller())


def test_a_stream_shorter_than_its_length_fails_typed():
    data = save_safetensors(TENSORS)
    with pytest.raises(DecodedLengthError):
        load_safetensors_stream(io.BytesIO(data[:-3]), len(data), "weights.rank0", _wanted(TENSORS), HostFiller())


@pytest.mark.parametrize("name, want, message", [
    ("w.a", WantedTensor(torch.float32, (4, 3)), "manifest declares"),
    ("w.a", WantedTensor(torch.float16, (3, 4)), "manifest declares"),
    ("w.missing", WantedTensor(torch.float32, (1,)), "lacks 'w.missing'"),
])
def test_a_header_disagreeing_with_the_manifest_fails_before_decoding(name, want, message):
    class Untouchable(HostFiller):
        def fill(self, stream, tensor):
            raise AssertionError("no tensor may be decoded")

    with pytest.raises(WeightMismatchError, match=message):
        _load(save_safetensors(TENSORS), {name: want}, Untouchable())


def test_fixture_weights_equal_the_whole_resource_path():
    core = open_fixture()
    model = load_model(core, LoadOptions(cuda_graphs=False))
    weights_id = next(info.id for info in core.resources if info.kind.name == "WEIGHTS")
    reference = load_safetensors(core.read_resource(weights_id))
    assert model.weights and all(torch.equal(t, reference[name]) for name, t in model.weights.items())


def test_a_tampered_weights_chunk_fails_load_model_typed(tmp_path):
    path = tmp_path / CORE.name
    shutil.copy(CORE, path)
    core = open_fixture(path)
    weights_id = next(info.id for info in core.resources if info.kind.name == "WEIGHTS")
    placement = core._loaded.placements[weights_id]
    with open(path, "r+b") as handle:
        handle.seek(placement.offset + placement.nbytes // 2)
        byte = handle.read(1)
        handle.seek(-1, io.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(ChunkDigestError):
        load_model(open_fixture(path), LoadOptions(cuda_graphs=False))


def test_float8_weights_stream_bit_for_bit():
    tensors = {"w.e4m3": (torch.arange(24) / 5 - 2).reshape(4, 6).to(torch.float8_e4m3fn),
               "w.e5m2": (torch.arange(10) * 3.5).to(torch.float8_e5m2)}
    data = save_safetensors(tensors)
    wanted = {name: WantedTensor(t.dtype, tuple(t.shape)) for name, t in tensors.items()}
    loaded = _load(data, wanted, HostFiller())
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype
        assert torch.equal(loaded[name].view(torch.uint8), tensor.view(torch.uint8))
