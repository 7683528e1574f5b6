"""The hybrid core's history state on CUDA equals the CPU's, buffer by buffer: after the prompt
step (max_tokens 1: the prefill or mixed program only) and after one decode step (max_tokens 2),
eager and replayed as CUDA graphs. Compared are the slot state rows (conv and SSM state of every
mixer layer), the continuation rows a prompt-boundary snapshot writes, and the key/value pages.
A failure names the plane, the slot and the first step whose state diverged, which tells a
device bug in the recurrent state apart from a wrong reference (tokens are checked against the
CPU run of the same core, then against transformers in tests/gpu/test_hybrid_cuda.py)."""

from __future__ import annotations

import pytest
import torch

from helios.contract import StartupOptions
from helios.core.reader import open_core
from helios.runtime.model import LoadOptions
from helios.runtime.offline import generate
from helios.runtime.plan import StorageKind
from helios.runtime.service import RuntimeOptions, build_runtime
from runtime.test_hybrid_runtime import NAMESPACE, PROMPTS, hybrid  # noqa: F401 (fixture)

pytestmark = pytest.mark.gpu
PAGES = 64  # the same page count on both devices, so both allocate the same pages
TOLERANCE = dict(rtol=1e-4, atol=1e-4)


def _runtime(hybrid, device: str, cuda_graphs: bool = False):  # noqa: F811
    root, _ = hybrid
    core = open_core(root / "model.core", accept=NAMESPACE, trusted_keys=[root / "publisher.key.pub"])
    load = LoadOptions(startup=StartupOptions(), device=device, num_pages=PAGES, cuda_graphs=cuda_graphs)
    return build_runtime(core, RuntimeOptions(load=load))


def _planes(runtime) -> dict[str, torch.Tensor]:
    """Host copies of every history plane: slot state rows, continuation rows, pages."""
    storage = runtime.engine.executor.storage
    found = {}
    for kind in (StorageKind.STATE, StorageKind.CONTINUATION, StorageKind.PAGE):
        pages, state = storage.planes(kind)
        for index, plane in enumerate(pages + state):
            found[f"{kind.name.lower()}[{index}] dim {plane.dim}"] = plane.tensor.detach().cpu()
    return found


def _differences(cpu: dict[str, torch.Tensor], cuda: dict[str, torch.Tensor]) -> list[str]:
    """'plane, row r: max |diff|' for every row (along the plane's row dimension) that differs."""
    found = []
    for name, expected in cpu.items():
        actual, dim = cuda[name], int(name.rsplit(" ", 1)[1])
        assert actual.shape == expected.shape, name
        for row in range(expected.shape[dim]):
            a, e = actual.select(dim, row), expected.select(dim, row)
            if not torch.allclose(a, e, **TOLERANCE):
                found.append(f"{name}, row {row}: max |diff| {float((a - e).abs().max()):.3g}")
    return found


@pytest.mark.parametrize("cuda_graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("max_tokens", [1, 2], ids=["after-prompt-step", "after-one-decode-step"])
def test_state_buffers_equal_the_cpu(hybrid, cuda_graphs, max_tokens):  # noqa: F811
    cpu, cuda = _runtime(hybrid, "cpu"), _runtime(hybrid, "cuda", cuda_graphs)
    try:
        on_cpu = [list(r.token_ids) for r in generate(cpu.engine, PROMPTS, max_tokens)]
        on_cuda = [list(r.token_ids) for r in generate(cuda.engine, PROMPTS, max_tokens)]
        torch.cuda.synchronize()
        differences = _differences(_planes(cpu), _planes(cuda))
        assert not differences, "CUDA state differs from the CPU's:\n" + "\n".join(differences)
        assert on_cuda == on_cpu
        _, state = cuda.engine.executor.storage.planes(StorageKind.STATE)
        assert all(p.tensor.device.type == "cuda" and p.tensor.abs().sum() > 0 for p in state)
    finally:
        cpu.close()
        cuda.close()


def test_tokens_equal_the_cpu_over_the_whole_generation(hybrid):  # noqa: F811
    """32 greedy steps batched: CUDA graphs give the CPU run's tokens (no reference involved)."""
    cpu, cuda = _runtime(hybrid, "cpu"), _runtime(hybrid, "cuda", True)
    try:
        expected = [list(r.token_ids) for r in generate(cpu.engine, PROMPTS, 32)]
        assert [list(r.token_ids) for r in generate(cuda.engine, PROMPTS, 32)] == expected
    finally:
        cpu.close()
        cuda.close()
