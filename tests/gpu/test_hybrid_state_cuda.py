"""The hybrid core's history state on CUDA equals the CPU's, buffer by buffer: after the prompt
step (max_tokens 1: the prefill or mixed program only) and after one decode step (max_tokens 2),
eager and replayed as CUDA graphs; and around the runtime's state copies between graph replays:
a snapshot published at a prompt boundary (slot rows and the partial page into a continuation
row), restored into a new request's private rows, and state offloaded to host slots by preemption
and restored. Compared are the slot state rows (conv and SSM state of every mixer layer), the
continuation rows, the host slots and the key/value pages.
A failure names the plane, the slot and the first step whose state diverged, which tells a
device bug in the recurrent state apart from a wrong reference (tokens are checked against the
CPU run of the same core, then against transformers in tests/gpu/test_hybrid_cuda.py)."""

from __future__ import annotations

import pytest
import torch

from helios.contract import StartupOptions
from helios.core.reader import open_core
from helios.runtime.loading.model import LoadOptions
from helios.runtime.offline import generate
from helios.runtime.records.plan import StorageKind
from helios.runtime.scheduling.policy import PreemptionMode, SchedulerPolicy
from helios.runtime.service import RuntimeOptions, build_runtime
from runtime.test_hybrid_runtime import NAMESPACE, PROMPTS, hybrid  # noqa: F401 (fixture)

pytestmark = pytest.mark.gpu
STEPS = 8  # few enough that float32 rounding differences stay far below the tolerance
PAGES = 64  # the same page count on both devices, so both allocate the same pages
TOLERANCE = dict(rtol=1e-4, atol=1e-4)


def _runtime(hybrid, device: str, cuda_graphs: bool = False, pages: int = PAGES, **options):  # noqa: F811
    root, _ = hybrid
    core = open_core(root / "model.core", accept=NAMESPACE, trusted_keys=[root / "publisher.key.pub"])
    load = LoadOptions(startup=StartupOptions(), device=device, num_pages=pages, cuda_graphs=cuda_graphs)
    runtime = build_runtime(core, RuntimeOptions(load=load, **options))
    runtime.engine.frames = 1  # the CPU's schedule (two frames on CUDA are covered by the token tests)
    return runtime


def _planes(runtime) -> dict[str, torch.Tensor]:
    """Host copies of every history plane: slot state rows, continuation rows, pages."""
    storage = runtime.engine.executor.storage
    found = {}
    for kind in (StorageKind.STATE, StorageKind.CONTINUATION, StorageKind.HOST, StorageKind.PAGE):
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
    """32 greedy steps batched, two frames on CUDA: CUDA graphs give the CPU run's tokens (no
    reference involved)."""
    cpu, cuda = _runtime(hybrid, "cpu"), _runtime(hybrid, "cuda", True)
    cuda.engine.frames = 2
    try:
        expected = [list(r.token_ids) for r in generate(cpu.engine, PROMPTS, 32)]
        assert [list(r.token_ids) for r in generate(cuda.engine, PROMPTS, 32)] == expected
    finally:
        cpu.close()
        cuda.close()


def _same_run(cpu, cuda, prompts, max_tokens: int = STEPS) -> None:
    """Both runtimes generate for `prompts`; tokens and every history plane agree afterwards."""
    on_cpu = [list(r.token_ids) for r in generate(cpu.engine, prompts, max_tokens)]
    on_cuda = [list(r.token_ids) for r in generate(cuda.engine, prompts, max_tokens)]
    torch.cuda.synchronize()
    differences = _differences(_planes(cpu), _planes(cuda))
    assert not differences, "CUDA state differs from the CPU's:\n" + "\n".join(differences)
    assert on_cuda == on_cpu


def test_snapshot_publish_and_restore_between_graph_replays(hybrid):  # noqa: F811
    cpu, cuda = _runtime(hybrid, "cpu"), _runtime(hybrid, "cuda", True)
    try:
        _same_run(cpu, cuda, [PROMPTS[0]])  # publishes slot rows + the partial page into a continuation row
        counters = cuda.engine.scheduler.counters()
        assert counters.snapshots_published > 0 and counters.snapshots_restored == 0
        _, rows = cuda.engine.executor.storage.planes(StorageKind.CONTINUATION)
        assert all(p.tensor.device == cuda.model.device for p in rows) and any(p.tensor.abs().sum() > 0 for p in rows)
        _same_run(cpu, cuda, [PROMPTS[1]])  # restores them into a new request's private rows
        assert cuda.engine.scheduler.counters().snapshots_restored == 1
        assert cpu.engine.scheduler.counters() == cuda.engine.scheduler.counters()
    finally:
        cpu.close()
        cuda.close()


def test_state_offload_and_restore_between_graph_replays(hybrid):  # noqa: F811
    options = dict(pages=17, host_pages=32, policy=SchedulerPolicy(preemption=PreemptionMode.OFFLOAD))
    cpu, cuda = _runtime(hybrid, "cpu", **options), _runtime(hybrid, "cuda", True, **options)
    try:
        _same_run(cpu, cuda, PROMPTS, 32)  # long enough to run out of pages
        assert cuda.engine.scheduler.counters().preemptions > 0
        assert cpu.engine.scheduler.counters() == cuda.engine.scheduler.counters()
        _, host_state = cuda.engine.executor.storage.planes(StorageKind.HOST)
        assert any(p.tensor.abs().sum() > 0 for p in host_state)  # state rows went to host slots and back
    finally:
        cpu.close()
        cuda.close()
