"""Where the ranks of a tensor-parallel core run, and which `torch.distributed` backend joins them.

The model's device decides the backend (`backend_for`): gloo on the CPU, NCCL on CUDA. Every
rank also keeps a gloo group for the runtime's control messages, which are CPU tensors that NCCL
cannot carry (see `helios.runtime.parallel.rank_rendezvous.Rendezvous.form_group`).

Devices of the ranks on rank zero's host (`place_local_ranks`): rank zero serves on the device it
was loaded on, ``cuda:B`` (``cuda`` and ``cuda:0`` both mean B = 0), and local rank r runs on
``cuda:(B + r)``, so a host with G visible GPUs holds at most G - B local ranks
(`MissingDeviceError` otherwise). On the CPU every rank runs on ``cpu``. A rank that joins from
another host chooses its own device (``helios rank --device``, `join_device`); its type must match
rank zero's backend.

Local peers of a CUDA model must be processes: NCCL can run several ranks as threads of one
process, but one process shares one CUDA context, so a fault on any rank's GPU (an illegal
address, a sticky launch error) ends every rank; CUDA graph capture in one thread forbids
unsafe CUDA calls from the others while it records; and the exported programs run op by op in
Python, so rank threads take turns on the GIL.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass

import torch

from helios.errors import LoadError


class RankBackend(enum.Enum):
    GLOO = "gloo"  # CPU models: every collective and every control message
    NCCL = "nccl"  # CUDA models: the programs' collectives (control messages stay on gloo)


class UnsupportedRanksError(LoadError):
    """The rank options do not fit the core or the device (for example threads on CUDA)."""


class MissingDeviceError(UnsupportedRanksError):
    """More local ranks than visible GPUs from rank zero's device on."""


@dataclass(frozen=True)
class RankPlacement:
    """The backend of the group and the device of each local rank (index = rank)."""

    backend: RankBackend
    devices: tuple[torch.device, ...]


def backend_for(device: str | torch.device) -> RankBackend:
    """NCCL for a CUDA device, gloo for the CPU; any other device type is refused."""
    kind = torch.device(device).type
    if kind == "cpu":
        return RankBackend.GLOO
    if kind == "cuda":
        return RankBackend.NCCL
    raise UnsupportedRanksError(f"tensor parallelism runs on the CPU (gloo) or on CUDA (NCCL), not on {device}")


def rank_device(device: str | torch.device, rank: int) -> torch.device:
    """The device of local rank `rank` when rank zero serves on `device`: ``cuda:(B + rank)``."""
    device = torch.device(device)
    if backend_for(device) is RankBackend.GLOO:
        return torch.device("cpu")
    return torch.device("cuda", (device.index or 0) + rank)


def place_local_ranks(device: str | torch.device, local_ranks: int, threads: bool,
                      visible_gpus: int | None = None) -> RankPlacement:
    """Backend and devices of ranks 0 .. local_ranks - 1 on rank zero's host.

    `threads`: whether local peers would be threads of this process (refused on CUDA).
    `visible_gpus`: defaults to ``torch.cuda.device_count()`` (asked only for a CUDA device).
    """
    backend = backend_for(device)
    devices = tuple(rank_device(device, rank) for rank in range(local_ranks))
    if backend is RankBackend.GLOO:
        return RankPlacement(backend, devices)
    if threads and local_ranks > 1:
        raise UnsupportedRanksError("local ranks of a CUDA model run as processes (--rank-peers processes): "
                                    "threads of one process would share one CUDA context")
    visible = torch.cuda.device_count() if visible_gpus is None else visible_gpus
    if devices[-1].index >= visible:
        raise MissingDeviceError(
            f"{local_ranks} local ranks from {devices[0]} on need {devices[0]} .. {devices[-1]}, but "
            f"{visible} GPU(s) are visible; use fewer --local-ranks (join the others from other hosts) or "
            "another device")
    return RankPlacement(backend, devices)


def share_local_threads(requested: int | None, local_ranks: int, cpu_processes: bool) -> tuple[int | None, int | None]:
    """(intra-op threads of each local rank process, this process's count before) where rank zero
    gives CPU rank processes their share, else (None, None). CPU ranks as processes share this
    host's cores: without a `requested` count each of the `local_ranks` ranks, rank zero included
    (which sets its own count here), takes an equal share of rank zero's threads. Each rank giving
    every core to its own ops oversubscribes the host, and every gloo collective then waits for a
    peer that is not scheduled (measured: a two-rank CPU decode step about 13 times slower). CUDA
    ranks and thread peers keep the count they have."""
    if not cpu_processes or requested or local_ranks < 2:
        return None, None
    before = torch.get_num_threads()
    threads = max(1, before // local_ranks)
    torch.set_num_threads(threads)
    return threads, before


def join_device(backend: RankBackend, device: str | None, visible_gpus: int | None = None) -> torch.device:
    """The device of a rank that joins a group of `backend`: its ``--device``, or the default
    (``cpu`` for gloo, ``cuda:0`` for NCCL). Raises `UnsupportedRanksError` when the device's kind
    does not fit `backend`, `MissingDeviceError` for a GPU beyond `visible_gpus` (default: CUDA's)."""
    chosen = torch.device("cpu" if backend is RankBackend.GLOO else "cuda") if device is None else parse_device(device)
    if backend_for(chosen) is not backend:
        raise UnsupportedRanksError(f"rank zero runs a {backend.value} group; device {chosen} needs "
                                    f"{backend_for(chosen).value}")
    if chosen.type == "cpu":
        return chosen
    chosen = torch.device("cuda", chosen.index or 0)
    visible = torch.cuda.device_count() if visible_gpus is None else visible_gpus
    if chosen.index >= visible:
        raise MissingDeviceError(f"this rank's device {chosen} is not one of the {visible} visible GPU(s)")
    return chosen


def parse_device(device: str) -> torch.device:
    """`device` as a torch device of the CPU or CUDA; `UnsupportedRanksError` for anything else
    (a name torch does not know, ``cuda:-1``, another device type)."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        parsed = None
    if parsed is None or parsed.type not in ("cpu", "cuda"):
        raise UnsupportedRanksError(f"device {device!r}: a rank runs on cpu or cuda[:N]")
    return parsed


def check_nccl_environment(environ=os.environ) -> None:
    """Refuses settings under which NCCL collectives would block the host (never captured into
    CUDA graphs, and never bounded by the step deadline). Checked by every rank before it loads."""
    if environ.get("TORCH_NCCL_BLOCKING_WAIT", "0").strip().lower() in ("1", "true", "yes", "on"):
        raise UnsupportedRanksError("TORCH_NCCL_BLOCKING_WAIT makes every NCCL collective block the host, "
                                    "which a CUDA graph cannot capture; unset it")
