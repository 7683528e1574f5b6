"""The vector instruction set Inductor builds the C++ CPU kernels for, probed once per machine.

Inductor picks it (`torch._inductor.cpu_vec_isa.pick_vec_isa`) among the sets the CPU lists by
building a probe for each and loading it in a child Python: about 1 s of CPU in children on every
process's first kernel build (a `helios serve` engine process, each `helios generate`), though the
probes' builds are cached. The pick depends only on the machine, the C++ compiler, torch and
``ATEN_CPU_CAPABILITY``, so the first process records it in Inductor's cache directory and a later
one takes the recorded pick: it turns the probes off (``torch._inductor.config.cpp.vec_isa_ok``,
every set the CPU lists taken as buildable) and keeps that only if Inductor then picks the recorded
set, which every kernel is then built for, as the probes would have had it; otherwise it turns them
on again and probes. Nothing is recorded or taken where the user set the probes or the width
(``TORCHINDUCTOR_VEC_ISA_OK``, the config) or the pick cannot be told.

Thread ownership: the loading thread, before the first kernel build of the process.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import threading
from pathlib import Path

_LOG = logging.getLogger(__name__)
_LOCK = threading.Lock()
_SETTLED = False


def settle_vector_isa(compiler: str | None) -> str | None:
    """Makes Inductor's pick of this machine's vector set for the C++ compiler at `compiler` (a path)
    without its probes where an earlier process recorded it, and records it otherwise; returns the
    pick's name, or None where nothing was done. Once per process; never raises."""
    global _SETTLED
    with _LOCK:
        if _SETTLED:
            return None
        _SETTLED = True
        try:
            return _settle(compiler)
        except Exception as error:  # noqa: BLE001 - Inductor then probes as it always did
            _LOG.debug("the vector instruction set is left to Inductor's probes: %s: %s", type(error).__name__, error)
            return None


def _settle(compiler: str | None) -> str | None:
    from torch._inductor import config, cpu_vec_isa

    if compiler is None or config.cpp.vec_isa_ok is not None or config.cpp.simdlen is not None:
        return None  # no compiler, or the user chose: Inductor as configured
    record = _record_path(compiler)
    recorded = record.read_text(encoding="utf-8").strip() if record.is_file() else None
    if recorded:
        config.cpp.vec_isa_ok = True
        cpu_vec_isa.valid_vec_isa_list.cache_clear()
        if str(cpu_vec_isa.pick_vec_isa()) == recorded:
            return recorded
        _LOG.info("Inductor's vector set without probes is not the recorded %r: probing again", recorded)
        config.cpp.vec_isa_ok = None
        cpu_vec_isa.valid_vec_isa_list.cache_clear()
    picked = str(cpu_vec_isa.pick_vec_isa())  # the probes
    record.parent.mkdir(parents=True, exist_ok=True)
    partial = record.with_name(f"{record.name}.{os.getpid()}.partial")
    partial.write_text(picked + "\n", encoding="utf-8")
    os.replace(partial, record)  # whole or absent for a process reading it meanwhile
    return picked


def _record_path(compiler: str) -> Path:
    """The record's file, named for what the pick depends on: the CPU's listed features, the compiler
    (path, size, modification time), torch (version and place), Python and ``ATEN_CPU_CAPABILITY``."""
    import torch
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    stat = os.stat(compiler)
    parts = [_cpu_features(), compiler, str(stat.st_size), str(stat.st_mtime_ns), torch.__version__,
             os.path.dirname(torch.__file__), sys.executable, os.environ.get("ATEN_CPU_CAPABILITY", "")]
    key = hashlib.sha256("\0".join(parts).encode("utf-8")).hexdigest()[:32]
    return Path(cache_dir()) / "helios-vector-isa" / key


def _cpu_features() -> str:
    """The first processor's feature line of /proc/cpuinfo (flags; features on other machines)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            lines = [line for line in info if line.split(":", 1)[0].strip() in ("flags", "features", "Features")]
    except OSError:
        lines = []
    return lines[0].strip() if lines else f"{os.uname().machine} (no cpuinfo)"
