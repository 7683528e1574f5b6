"""End to end on CUDA through the real runtime (`build_runtime` with `LoadOptions(device="cuda")`).

Tiny random checkpoints (tests/ignition/hf_checkpoints.py with the test tokenizer) are prepared into
float32 and bfloat16 cores once per module. Then:

- float32 on CUDA, with and without CUDA graphs, gives the CPU path's greedy tokens for a batch of
  prompts of different lengths (chunked prefill included), with logits equal up to rounding (dense
  and mixture-of-experts families: the expert kernels at decode, prefill and mixed batch sizes);
- the bfloat16 core on CUDA stays close to the float32 CPU path (first tokens and logits);
- a soak of 2000 short requests with random cancellations (tests/support/engine_soak.py, the
  driver tests/runtime/test_engine_soak.py runs on the CPU) allocates no device memory once warm,
  ends every request exactly once, returns every page and slot, and its greedy requests get the
  CPU path's tokens.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from helios.core.keys import SigningKey
from helios.core.reader import open_core
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core
from helios.runtime.records.events import FinishReason
from helios.runtime.loading.model import LoadOptions
from helios.runtime.service import RuntimeOptions, build_runtime
from ignition.hf_checkpoints import DEEPSEEK, GLM4_MOE, GPT_OSS, LLAMA3, MISTRAL, QWEN3, QWEN3_MOE
from support.chat_checkpoint import write_chat_checkpoint
from support.engine_soak import EngineSoak, SoakSettings, check_soak, greedy_completed
from support.runtime_runs import first_difference, greedy_run, logits_error

pytestmark = pytest.mark.gpu
NAMESPACE = "test.helios/gpu"
PLAN = CapacityPlan(context_tokens=256, prefill_tokens=32, decode_batches=(1, 4, 8))
NEW_TOKENS = 64
_CHOOSER = random.Random(11)
PROMPTS = [[_CHOOSER.randrange(3, 320) for _ in range(n)] for n in (1, 5, 9, 17, 32, 33, 70, 150)]


class Cores:
    """Cores prepared on first use: (family, dtype) -> path, all signed by one key."""

    def __init__(self, root: Path):
        self.root = root
        self.key = SigningKey.generate()
        self._paths: dict[tuple[str, str], Path] = {}
        self._cpu_runs: dict[str, object] = {}

    def open(self, family, dtype: str = "float32"):
        name = (family.name, dtype)
        if name not in self._paths:
            checkpoint = self.root / family.name
            if not checkpoint.is_dir():
                write_chat_checkpoint(family, checkpoint, seed=5)
            path = self.root / f"{family.name}-{dtype}.core"
            prepare_core(checkpoint, path, self.key, PrepareOptions(NAMESPACE, dtype=dtype, capacities=PLAN))
            self._paths[name] = path
        return open_core(self._paths[name], accept=NAMESPACE, trusted_keys=[self.key.public])

    def cpu_run(self, family):
        """The float32 CPU path's greedy run of PROMPTS (computed once per family)."""
        if family.name not in self._cpu_runs:
            self._cpu_runs[family.name] = greedy_run(self.open(family), PROMPTS, NEW_TOKENS)
        return self._cpu_runs[family.name]


@pytest.fixture(scope="module")
def cores(tmp_path_factory) -> Cores:
    return Cores(tmp_path_factory.mktemp("gpu-cores"))


def cuda_options(cuda_graphs: bool = True) -> LoadOptions:
    return LoadOptions(device="cuda", cuda_graphs=cuda_graphs)


@pytest.mark.parametrize("cuda_graphs", [True, False], ids=["graphs", "eager"])
@pytest.mark.parametrize("family", [QWEN3, LLAMA3, QWEN3_MOE, GLM4_MOE, DEEPSEEK, MISTRAL, GPT_OSS], ids=lambda f: f.name)
def test_float32_greedy_tokens_on_cuda_equal_the_cpu_path(cores, family, cuda_graphs):
    """MISTRAL: every layer slides, so pages outside the window are released while it runs;
    GPT_OSS: attention sinks, sliding and full layers, experts (the sinks and expert kernels)."""
    reference = cores.cpu_run(family)
    run = greedy_run(cores.open(family), PROMPTS, NEW_TOKENS, cuda_options(cuda_graphs))
    assert run.captured == cuda_graphs
    for index, (tokens, expected) in enumerate(zip(run.tokens, reference.tokens)):
        assert tokens == expected, f"prompt {index} (length {len(PROMPTS[index])}) differs from token " \
                                   f"{first_difference(tokens, expected)}"
    assert logits_error(run, reference) < 1e-3


def test_bfloat16_core_on_cuda_stays_close_to_the_float32_cpu_path(cores):
    reference = cores.cpu_run(QWEN3)
    run = greedy_run(cores.open(QWEN3, "bfloat16"), PROMPTS, NEW_TOKENS, cuda_options())
    assert run.captured
    agreeing = [first_difference(tokens, expected) >= 8 for tokens, expected in zip(run.tokens, reference.tokens)]
    assert sum(agreeing) >= len(PROMPTS) - 2, agreeing
    assert logits_error(run, reference) < 0.05


def test_soak_allocates_nothing_once_warm_and_frees_everything(cores):
    runtime = build_runtime(cores.open(QWEN3), RuntimeOptions(load=cuda_options()))
    try:
        assert all(type(p.module).__name__ == "CapturedProgram" for p in runtime.model.programs)
        settings = SoakSettings(num_requests=2000, seed=7, max_prompt=64, max_tokens=12, arrival=0.1, warmup=200)
        probe = lambda: torch.cuda.memory_stats()["allocation.all.allocated"]  # noqa: E731 (cumulative count)
        soak = EngineSoak(runtime.engine, settings, probe)
        soak.run()
        reasons = check_soak(soak)
    finally:
        runtime.close()
    assert reasons[FinishReason.CANCELLED] > 20 and reasons[FinishReason.LENGTH] > 1000, reasons
    warm, end = soak.readings
    assert end == warm, f"{end - warm} device allocations while serving after the warm-up"
    picked = greedy_completed(soak)[:16]
    quiet = greedy_run(cores.open(QWEN3), [r.prompt for r in picked], settings.max_tokens)  # CPU path
    for request, tokens in zip(picked, quiet.tokens):
        assert request.tokens == tokens[:request.max_tokens], request.request_id


def test_startup_tuning_outputs_survive_graph_capture(cores):
    """The producer runs before capture; capture re-zeroes the buffers warm-up wrote, but not its
    outputs: the decode split counts the graphs read are the producer's, for this GPU."""
    from helios.runtime.loading.model import load_model

    model = load_model(cores.open(QWEN3), cuda_options())
    splits = model.buffers["attention_splits"]
    assert splits.device.type == "cuda" and splits.numel() >= 1
    assert bool((splits >= 1).all())


def test_released_graphs_refuse_to_replay():
    """A rank releases its graphs before tearing down NCCL; a released program fails typed."""
    from types import SimpleNamespace

    from helios.runtime.loading.cuda_graphs import CaptureError, CapturedProgram, release_graphs

    static = torch.zeros(4, device="cuda")

    def record(offset: float):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = static + offset
        return graph, out

    captured = CapturedProgram(record(1.0), record(2.0), [static])
    assert torch.equal(captured.replay(greedy=True), torch.full((4,), 2.0, device="cuda"))
    program = SimpleNamespace(module=captured)
    release_graphs([program, program])  # idempotent
    with pytest.raises(CaptureError, match="released"):
        captured.replay(greedy=False)


def test_penalised_requests_on_cuda_give_the_cpu_path_tokens(cores):
    """Prompt histograms reach the device from pinned host rows, only for requests with a penalty
    (`helios.runtime.execution.prompt_histogram`): penalised, then plain greedy (the slots' rows
    are left stale, nothing reads them), then penalised again give the CPU path's tokens."""
    from helios.runtime.offline import generate
    from helios.runtime.records.sampling_params import SamplingParams

    penalised = SamplingParams(repetition_penalty=1.3, presence_penalty=0.4)
    runs = {}
    for device in ("cpu", "cuda"):
        runtime = build_runtime(cores.open(QWEN3), RuntimeOptions(load=LoadOptions(device=device,
                                                                                   cuda_graphs=device == "cuda")))
        try:
            runs[device] = [[list(r.token_ids) for r in generate(runtime.engine, PROMPTS, 16, sampling=sampling)]
                            for sampling in (penalised, SamplingParams(), penalised)]
        finally:
            runtime.close()
    assert runs["cuda"] == runs["cpu"]
    assert runs["cpu"][0] == runs["cpu"][2] and runs["cpu"][0] != runs["cpu"][1]  # the penalties count


@pytest.mark.parametrize("family", [QWEN3, MISTRAL], ids=lambda f: f.name)
def test_two_frames_on_cuda_give_the_cpu_path_tokens(cores, family):
    """On CUDA the engine keeps two frames in flight: decode rounds fed by device-owned pending
    tokens run behind the round whose tokens the host has not read yet (MISTRAL: sliding-window
    pages are released while the next round runs)."""
    from helios.runtime.offline import generate

    reference = cores.cpu_run(family)
    runtime = build_runtime(cores.open(family), RuntimeOptions(load=cuda_options()))
    try:
        assert runtime.engine.frames == 2
        results = generate(runtime.engine, PROMPTS, NEW_TOKENS)
        behind = runtime.engine.stats.second_frames
    finally:
        runtime.close()
    assert behind >= NEW_TOKENS // 2, behind
    for index, (result, expected) in enumerate(zip(results, reference.tokens)):
        assert list(result.token_ids) == expected, f"prompt {index} differs from token " \
                                                   f"{first_difference(list(result.token_ids), expected)}"


def test_a_cuda_step_uploads_its_values_in_one_copy_from_the_step_arena(cores):
    """The loaded model's per-step buffers share one device allocation (the step arena) and the
    packer's pinned mirrors of it go up in one copy per step (the first step also clears the masks)."""
    from helios.runtime.offline import generate

    runtime = build_runtime(cores.open(LLAMA3), RuntimeOptions(load=cuda_options()))
    try:
        packer = runtime.engine.executor.packer
        staging = packer._staging
        assert staging._step_mirrors.arena
        packs = []
        pack = packer.pack

        def counted(graph, plan, submission=None):
            before = staging.uploads
            pack(graph, plan, submission)
            packs.append(staging.uploads - before)

        packer.pack = counted
        results = generate(runtime.engine, PROMPTS[:4], 8)
    finally:
        runtime.close()
    assert all(len(r.token_ids) == 8 for r in results)
    # A steady decode step rewrites only what changes every step (one run; the kept values lie after
    # it); a step that admits or finishes rows rewrites some kept buffers too (two runs at most).
    assert packs and packs[0] <= 2 and max(packs[1:]) <= 2 and packs[1:].count(1) >= 2 * len(packs[1:]) // 3, packs
