"""How rank zero runs a core prepared for N > 1 ranks (`RankOptions`), in a module that imports no
torch: the command line reads the peer kinds for its help and builds the options before any of the
runtime is imported (`helios.cli.rank_options`). `helios.runtime.parallel.rank_peers` runs them.
"""

from __future__ import annotations

import enum
import os
import sys
from dataclasses import dataclass

CPP_LOG_LEVEL = "TORCH_CPP_LOG_LEVEL"


def quiet_torch_cpp_log() -> None:
    """Silences torch's C++ warnings in a command process that has not imported torch yet (torch
    reads the level once, as it loads; a value the user set is kept). A group that fails to form
    or breaks makes c10d and gloo log warnings, some with a C++ backtrace, beside the one typed
    line the command ends with, which reports the error; errors still print. Every process of a
    tensor-parallel group calls this first: rank zero's command (`helios.cli.rank_options`, which
    `serve` and `generate` import before torch; its engine process inherits the variable) and
    each rank's (`helios.cli.rank_cmd`)."""
    if "torch" not in sys.modules:
        os.environ.setdefault(CPP_LOG_LEVEL, "ERROR")


class PeerKind(enum.Enum):
    PROCESSES = "processes"
    THREADS = "threads"


@dataclass(frozen=True)
class RankOptions:
    """How rank zero runs a core prepared for N > 1 ranks."""

    local_ranks: int | None = None  # ranks on this host, rank zero included; None: all N
    peers: PeerKind = PeerKind.PROCESSES
    rendezvous: str = "127.0.0.1:0"  # HOST:PORT rank zero serves; port 0 picks a free one
    join_timeout_s: float = 300.0  # for every rank to load and join
    collective_timeout_s: float = 60.0  # bounds every collective; a silent rank fails the model after it
    # Intra-op threads of each local rank process. None: on the CPU every local rank, rank zero
    # included, takes an equal share of rank zero's threads; on CUDA rank zero's count.
    torch_threads: int | None = None
    aes_key_file: str | None = None  # for local rank processes of a sealed (version 4) core
    # CUDA: small all-reduces through a one-shot symmetric-memory kernel when every rank can
    # (`helios.abi.symmetric_reduce`); off by default until measured on the device, and because a
    # rank lost inside one leaves its peers' kernels waiting (NCCL's abort does not end them).
    symmetric_all_reduce: bool = False
