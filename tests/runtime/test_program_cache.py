"""Deserialized programs kept for a later load of the same bytes (`helios.runtime.loading.program_cache`):
a second load deserializes nothing, still checks every program's ops and gives the recorded tokens;
what it gets shares no module, graph or tensor with the first load (a parameter moved or written in
place by one load's runtime is not the other's); nothing is kept by default, and no more than the limit."""

from __future__ import annotations

import pytest
import torch

from helios.abi.program_image import encode_program, read_program_image
from helios.runtime.loading import program_cache, programs
from helios.runtime.loading.program_cache import deserialized_program, keep_deserialized_programs
from helios.runtime.offline import generate
from helios.runtime.service import build_runtime
from runtime.test_model_fixture import EXPECTED, open_fixture


class _Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.arange(6.0).reshape(2, 3), requires_grad=False)
        self.register_buffer("offset", torch.ones(2))

    def forward(self, x):
        return x @ self.weight.T + self.offset + torch.tensor([10.0, 20.0])  # the last one a lifted constant


@pytest.fixture
def kept(monkeypatch):
    """The cache on (limit 8) and empty, the suite's limit (tests/conftest.py) restored after, emptied;
    counts torch's deserializer calls."""
    calls = []
    deserialize = program_cache.deserialize_program
    monkeypatch.setattr(program_cache, "deserialize_program", lambda image: calls.append(1) or deserialize(image))
    previous = keep_deserialized_programs(0)
    keep_deserialized_programs(8)
    yield calls
    keep_deserialized_programs(0)
    keep_deserialized_programs(previous)


def _image_bytes() -> bytes:
    return encode_program(torch.export.export(_Scaled(), (torch.ones(1, 3),)))


def _tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    found = [*module.parameters(), *module.buffers()]
    found += [value for inner in module.modules() for value in vars(inner).values() if isinstance(value, torch.Tensor)]
    return found


def test_a_kept_program_is_rebuilt_with_its_own_tensors(kept):
    data = _image_bytes()
    x = torch.ones(1, 3)
    first = deserialized_program(read_program_image(data), data).module()
    second = deserialized_program(read_program_image(data), data).module()
    assert len(kept) == 1  # the second build reused the first's graph
    assert first.graph is not second.graph and not set(first.graph.nodes) & set(second.graph.nodes)
    assert len(_tensors(second)) >= 3  # the parameter, the buffer and the lifted constant
    pointers = {t.untyped_storage().data_ptr() for t in _tensors(first)}
    assert not pointers & {t.untyped_storage().data_ptr() for t in _tensors(second)}
    expected = second(x)
    for tensor in _tensors(first):  # what a runtime may do to its own: write in place, replace the data
        tensor.zero_()
    first.weight.data = torch.full((2, 3), 7.0)
    assert torch.equal(second(x), expected)
    third = deserialized_program(read_program_image(data), data).module()
    assert len(kept) == 1 and torch.equal(third(x), expected)


def test_nothing_is_kept_by_default_nor_past_the_limit(kept):
    data = _image_bytes()
    other = encode_program(torch.export.export(_Scaled(), (torch.ones(2, 3),)))
    keep_deserialized_programs(0)
    for _ in range(2):
        deserialized_program(read_program_image(data), data)
    assert len(kept) == 2
    keep_deserialized_programs(1)
    for image in (data, other, data):  # the second evicts the first
        deserialized_program(read_program_image(image), image)
    assert len(kept) == 5
    deserialized_program(read_program_image(data), data)
    assert len(kept) == 5
    with pytest.raises(ValueError):
        keep_deserialized_programs(-1)


def test_a_second_load_deserializes_nothing_checks_every_program_and_gives_the_recorded_tokens(kept, monkeypatch):
    checked = []
    validate = programs.validate_program_ops
    monkeypatch.setattr(programs, "validate_program_ops", lambda *a: checked.append(1) or validate(*a))
    for load in range(2):
        runtime = build_runtime(open_fixture())
        try:
            results = generate(runtime.engine, EXPECTED["prompts"], EXPECTED["max_tokens"])
            assert [list(r.token_ids) for r in results] == EXPECTED["token_ids"]
        finally:
            runtime.close()
        if load == 0:
            built = len(kept)
            assert built >= len(runtime.model.programs) and len(checked) == built
    assert len(kept) == built and len(checked) == 2 * built  # each program checked again, built from what was kept
