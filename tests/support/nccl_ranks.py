"""Two NCCL ranks as spawned processes (one GPU each) running the collective ABI ops eagerly and
from a captured CUDA graph; each rank sends its results (on the CPU) back to the test.

Spawned with ``multiprocessing`` ("spawn"): this module must be importable in the child, which is
why it lives in `support` rather than in the test module.
"""

from __future__ import annotations

import traceback
from datetime import timedelta

import torch

RANKS = 2
TIMEOUT = timedelta(seconds=60)


def inputs(rank: int, step: int, device) -> torch.Tensor:
    """Rank `rank`'s input of round `step`: bf16 values no other rank or round shares."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn((3, 257), generator=generator).to(torch.bfloat16).to(device)


def report_rank(rank: int, address: str, results, work) -> None:
    """Runs ``work(rank, address)`` -> (group, outputs) in this spawned rank and puts (rank, outputs)
    or (rank, error text) on `results`, then leaves the group by aborting it (what a rank does when
    it stops); a hang there shows as the process not exiting, after the results have been reported."""
    group = None
    try:
        group, outputs = work(rank, address)
        results.put((rank, outputs))
    except BaseException:  # noqa: BLE001 - the test reports the child's traceback
        results.put((rank, traceback.format_exc()))
    if group is not None:
        group.abort()


def form_group(rank: int, address: str, ranks: int = RANKS, **options):
    """This spawned rank's NCCL group of `ranks` on ``cuda:rank`` (rank 0 serves the rendezvous at
    `address`): (group, device)."""
    from helios.runtime.parallel.rank_rendezvous import Rendezvous

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    host, _, port = address.rpartition(":")
    rendezvous = Rendezvous.serve(host, int(port), TIMEOUT) if rank == 0 else Rendezvous.join(address, TIMEOUT)
    return rendezvous.form_group(rank, ranks, TIMEOUT, device, **options), device


def run_rank(rank: int, address: str, results) -> None:
    """Forms the group on ``cuda:rank`` and runs the collective ops (`report_rank`)."""
    report_rank(rank, address, results, _collectives)


def _collectives(rank: int, address: str):
    import helios.abi.collectives  # noqa: F401 - registers the ops
    from helios.abi.collectives import GroupCollectives
    group, device = form_group(rank, address)
    ops = GroupCollectives(group)  # the ops as a bound program calls them
    static = inputs(rank, 0, device)
    eager = {"reduce": ops.all_reduce(static, RANKS), "gather": ops.all_gather(static, RANKS),
             "broadcast": ops.broadcast(static, RANKS, 1)}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up of every op off the capturing stream, as capture wants
        ops.all_reduce(static, RANKS)
        ops.all_gather(static, RANKS)
        ops.broadcast(static, RANKS, 1)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = {"reduce": ops.all_reduce(static, RANKS), "gather": ops.all_gather(static, RANKS),
                    "broadcast": ops.broadcast(static, RANKS, 1)}
    static.copy_(inputs(rank, 1, device))
    graph.replay()  # the replay needs no host call: the group's collectives were recorded
    torch.cuda.synchronize(device)
    results = {f"eager.{name}": value.cpu() for name, value in eager.items()}
    results.update({f"graph.{name}": value.cpu() for name, value in captured.items()})
    return group, results


def symmetric_inputs(rank: int, step: int, device) -> dict[str, torch.Tensor]:
    """Tensors the one-shot reducer takes (bf16 and float32, whole 16-byte units) and one it leaves
    to NCCL (an odd byte count)."""
    generator = torch.Generator().manual_seed(7000 + 1000 * step + rank)
    return {"bf16": torch.randn((4, 256), generator=generator).to(torch.bfloat16).to(device),
            "f32": torch.randn((2, 96), generator=generator).to(device),
            "odd": torch.randn((3, 257), generator=generator).to(torch.bfloat16).to(device)}


def run_symmetric_rank(rank: int, address: str, results) -> None:
    """Like `run_rank`, with the group formed with the symmetric all-reduce: the outputs also name
    the group's all-reduce path and why symmetric memory was refused."""
    report_rank(rank, address, results, _symmetric)


def _symmetric(rank: int, address: str):
    import helios.abi.collectives  # noqa: F401 - registers the ops
    from helios.abi.collectives import GroupCollectives
    group, device = form_group(rank, address, symmetric=True)
    static = symmetric_inputs(rank, 0, device)
    reduce = GroupCollectives(group).all_reduce  # as a bound program calls it
    eager = {name: reduce(x, RANKS) for name, x in static.items()}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for x in static.values():
            reduce(x, RANKS)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = {name: reduce(x, RANKS) for name, x in static.items()}
    for name, x in symmetric_inputs(rank, 1, device).items():
        static[name].copy_(x)
    for _ in range(3):  # replays back to back reuse the symmetric buffers
        graph.replay()
    torch.cuda.synchronize(device)
    outputs = {f"eager.{name}": value.cpu() for name, value in eager.items()}
    outputs.update({f"graph.{name}": value.cpu() for name, value in captured.items()})
    outputs["path"], outputs["refusal"] = group.all_reduce_path, rendezvous.symmetric_refusal
    return group, outputs
