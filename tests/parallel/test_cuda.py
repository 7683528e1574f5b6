"""Tensor parallelism on two GPUs (device machine only): the collective ABI ops through NCCL, eager
and replayed from a CUDA graph, bit for bit equal on both ranks; a two-rank core on cuda:0 and
cuda:1 (rank 1 a local process) generates the greedy tokens the one-rank core generates on
cuda:0 (hybrid Mamba2 cores too: each rank's state rows, and a one-group mixer's norm summed over
the ranks); a lost GPU rank fails the model instead of hanging it."""

from __future__ import annotations

import multiprocessing
import signal
from dataclasses import replace

import pytest
import torch

from helios.runtime.loading.cuda_graphs import CapturedProgram
from helios.runtime.loading.model import LoadOptions
from helios.runtime.offline import generate
from helios.runtime.parallel.rank_peers import PeerKind
from helios.runtime.service import RuntimeOptions, build_runtime
from ignition.hf_checkpoints import BAMBA, BAMBA_ONE_GROUP, LLAMA3, QWEN3
from support import nccl_ranks, shard_sampling

from .conftest import FAST, MAX_TOKENS, PROMPTS
from .test_failures import HANG_GUARD_S, lose_a_rank_mid_generation
from .test_generate_cli import free_port

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="tensor parallelism on CUDA needs two GPUs"),
]

GPU_RANKS = replace(FAST, peers=PeerKind.PROCESSES, collective_timeout_s=10.0)


def _spawn_ranks(target) -> tuple[dict, list]:
    """Two spawned ranks running `target(rank, address, results)`: each rank's outputs (a failure's
    traceback fails the test) and the processes' exit codes."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    address = f"127.0.0.1:{free_port()}"
    ranks = [context.Process(target=target, args=(rank, address, results)) for rank in range(2)]
    for process in ranks:
        process.start()
    try:
        outputs = dict(results.get(timeout=HANG_GUARD_S) for _ in ranks)
        for process in ranks:
            process.join(HANG_GUARD_S)
    finally:
        for process in ranks:
            process.kill()
    for rank, output in outputs.items():
        assert isinstance(output, dict), f"rank {rank} failed:\n{output}"
    return outputs, [process.exitcode for process in ranks]


def test_collectives_on_two_gpus_agree_bit_for_bit_eagerly_and_in_a_cuda_graph():
    outputs, exits = _spawn_ranks(nccl_ranks.run_rank)
    for mode, step in (("eager", 0), ("graph", 1)):
        x0, x1 = (nccl_ranks.inputs(rank, step, "cpu") for rank in range(2))
        expected = {"reduce": x0 + x1, "gather": torch.stack([x0, x1]), "broadcast": x1}
        for name, value in expected.items():
            mine, theirs = outputs[0][f"{mode}.{name}"], outputs[1][f"{mode}.{name}"]
            assert torch.equal(mine, theirs), f"{mode} {name} differs between the ranks"
            assert torch.equal(mine, value), f"{mode} {name} is not the {name} of the ranks' inputs"
    assert exits == [0, 0], f"ranks exited {exits} (None: still inside the group abort after reporting)"


def test_the_symmetric_all_reduce_is_selected_and_sums_bit_for_bit_eagerly_and_in_a_cuda_graph():
    """torch 2.11 on two H200s has symmetric memory: the group takes the one-shot path for small
    float32 / bf16 tensors (NCCL for the rest), identical on both ranks and equal to the sum."""
    outputs, _ = _spawn_ranks(nccl_ranks.run_symmetric_rank)
    assert outputs[0]["path"] == outputs[1]["path"] == "symmetric", outputs[0]["refusal"] or outputs[1]["refusal"]
    for mode, step in (("eager", 0), ("graph", 1)):
        x0, x1 = (nccl_ranks.symmetric_inputs(rank, step, "cpu") for rank in range(2))
        for name in x0:
            mine, theirs = outputs[0][f"{mode}.{name}"], outputs[1][f"{mode}.{name}"]
            assert torch.equal(mine, theirs), f"{mode} {name} differs between the ranks"
            assert torch.equal(mine, x0[name] + x1[name]), f"{mode} {name} is not the sum of the ranks' inputs"


def test_vocabulary_shard_sampling_and_the_fused_residual_all_reduce_on_two_gpus():
    """Eagerly and replayed from a CUDA graph, both ranks return what one GPU computes from the
    whole rows: the full binding's tokens (gathered rows, the fused sampling kernel), the greedy
    binding's (winners only), the log-probabilities; and all_reduce + add_rms_norm bit for bit."""
    from helios.abi.fused import add_rms_norm  # noqa: F401 - registers the op
    from helios.abi.sampling import SampleVariant
    from helios.abi.token_logprobs import logprobs_reference

    outputs, _ = _spawn_ranks(shard_sampling.run_shard_rank)
    (x, p0, weight), (_, p1, _) = (shard_sampling.residual_inputs(rank) for rank in range(2))
    summed, normed = torch.ops.helios.add_rms_norm(x.cuda(), (p0 + p1).cuda(), weight.cuda(), 1e-6)
    for vocab in (shard_sampling.VOCAB, shard_sampling.ALIGNED_VOCAB):  # torch ops; the fused greedy pass
        args = {name: value.cuda() for name, value in shard_sampling.row_inputs(0, vocab).items()}
        rest = [args[name] for name in shard_sampling.SAMPLE_ARGS]
        full = SampleVariant.FULL(args["logits"], *rest).cpu()
        greedy = SampleVariant.GREEDY(args["logits"], *rest).cpu()
        cpu = {name: value.cpu() for name, value in args.items()}
        tokens = torch.zeros(shard_sampling.ROWS, dtype=torch.int64) + 4
        _, top_ids, top = logprobs_reference(cpu["logits"], tokens, *(cpu[n] for n in shard_sampling.SAMPLE_ARGS[6:]),
                                             5)
        for rank in range(2):
            for mode in ("eager", "graph"):
                prefix = f"{mode}.{vocab}."
                mine = {name[len(prefix):]: value for name, value in outputs[rank].items() if name.startswith(prefix)}
                assert torch.equal(mine["full"], full) and torch.equal(mine["greedy"], greedy), (rank, mode, vocab)
                assert torch.equal(mine["logprobs"][1], top_ids), (rank, mode, vocab)
                assert torch.allclose(mine["logprobs"][2], top, atol=1e-6, rtol=0), (rank, mode, vocab)
                assert torch.equal(mine["norm"][0], summed.cpu()) and torch.equal(mine["norm"][1], normed.cpu())


def test_two_gpu_ranks_sample_and_score_what_one_gpu_does(cores):
    """Seeded draws, penalties, logit bias and logprobs (test_sharded_sampling's requests) with CUDA
    graphs: steps in which nothing draws replay the winners-only greedy graph."""
    from .test_sharded_sampling import sampled_run

    load = LoadOptions(device="cuda", cuda_graphs=True)
    one, _ = sampled_run(cores.open(cores.core(QWEN3, 1)), RuntimeOptions(load=load))
    two, outputs = sampled_run(cores.open(cores.core(QWEN3, 2)), RuntimeOptions(load=load, ranks=GPU_RANKS))
    assert "shard_logits" in outputs
    assert {r: tokens for r, (tokens, _) in two.items()} == {r: tokens for r, (tokens, _) in one.items()}
    for request_id in ("r0", "r2"):
        for mine, theirs in zip(two[request_id][1], one[request_id][1], strict=True):
            assert abs(mine.logprob - theirs.logprob) < 1e-4
            assert [i for i, _ in mine.top] == [i for i, _ in theirs.top]


def test_two_gpu_ranks_with_the_symmetric_all_reduce_generate_what_one_gpu_generates(cores):
    one = cuda_tokens(cores.open(cores.core(QWEN3, 1)), True)
    two = cuda_tokens(cores.open(cores.core(QWEN3, 2)), True, replace(GPU_RANKS, symmetric_all_reduce=True))
    assert two == one


def cuda_tokens(core, cuda_graphs: bool, ranks=GPU_RANKS) -> list[list[int]]:
    load = LoadOptions(device="cuda", cuda_graphs=cuda_graphs)
    runtime = build_runtime(core, RuntimeOptions(load=load, ranks=ranks))
    try:
        assert runtime.model.device == torch.device("cuda", 0)
        if ranks.symmetric_all_reduce:
            assert runtime.engine.executor.all_reduce_path == "symmetric"
        captured = [isinstance(p.module, CapturedProgram) for p in runtime.model.programs]
        assert captured == [cuda_graphs] * len(captured)
        results = generate(runtime.engine, PROMPTS, MAX_TOKENS)
    finally:
        runtime.close()
    assert [r.finish_reason.name for r in results] == ["LENGTH"] * len(PROMPTS), [r.message for r in results]
    return [list(r.token_ids) for r in results]


@pytest.mark.parametrize("family, cuda_graphs", [(QWEN3, True), (QWEN3, False), (LLAMA3, True), (BAMBA, True),
                                                 (BAMBA_ONE_GROUP, True)],
                         ids=["qwen3-graphs", "qwen3-eager", "llama3-graphs", "bamba-graphs", "bamba-one-group-graphs"])
def test_two_gpu_ranks_generate_what_one_gpu_generates(cores, family, cuda_graphs):
    one = cuda_tokens(cores.open(cores.core(family, 1)), cuda_graphs)
    two = cuda_tokens(cores.open(cores.core(family, 2)), cuda_graphs)
    assert two == one
    assert all(len(tokens) == MAX_TOKENS for tokens in two)


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP], ids=["dies", "stops-answering"])
def test_a_lost_gpu_rank_ends_requests_in_flight_with_errors(cores, how):
    options = RuntimeOptions(load=LoadOptions(device="cuda"), ranks=replace(GPU_RANKS, collective_timeout_s=3.0))
    runtime = build_runtime(cores.open(cores.core(QWEN3, 2)), options)
    try:
        lose_a_rank_mid_generation(runtime, how)
    finally:
        runtime.close()

