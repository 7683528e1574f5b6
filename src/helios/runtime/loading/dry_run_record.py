"""What a load's Triton precompile dry run found, kept in Triton's on-disk cache, so that a later load
of the same core skips the dry run where it would compile nothing.

The dry run (`helios.runtime.loading.kernel_precompile`) runs every capture plan once, on stand-ins
while the weights load, to find the Triton variants the warm-up runs would compile one by one. On a
machine that loaded the core before, every variant is in Triton's cache already and the dry run
compiles nothing, yet it runs all the same: 3.6 s of an 8B core's 15.9 s load on an H100, on the
loading thread that the capture waits for (bench/results/h100_session66/cold_start.log).

So after a load whose dry run ran, its variants are written down (`DryRunRecord.save`): each as the
job a worker would compile (`CompileJob`, in Python literals), in a JSON file of Triton's cache under
a key of what decides which variants a load launches: the core (its signed body's SHA-256), the
programs selected, what the buffers' sizes follow from, the `TRITON_*` environment and this install
(the versions of Python, torch and Triton, and the path, size and modification time of every file of
the helios package), with the GPU it ran on (name, compute capability, multiprocessor count). A
later load with that key on a GPU alike skips the dry run where every variant listed is for its
device's target and in Triton's cache now (`all_on_disk`: the lookup `triton.compile` makes,
from the kernels' current source). Skipping changes no result, only where variants compile:
the dry run launches nothing the warm-up runs do not launch again, and they load each variant from
the cache as they did after a dry run. A record that is missing, unreadable or names a variant that
is not on disk means the dry run runs, as on a first load, and its record is written again.
Writing is best effort (a read-only cache is logged and the load goes on).

Only one-rank loads keep records: a tensor-parallel rank's dry run makes collectives, which every
rank must make alike, and each rank would decide for itself.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Iterable

import torch

import helios
from helios.runtime.loading.kernel_precompile import CompileJob, cached_on_disk

_LOG = logging.getLogger(__name__)
FILENAME = "helios-dry-run.json"
FORMAT = 1  # the file's layout: a record of another is not read


class DryRunRecord:
    """The record of one load's dry run, under `key` (`for_load`)."""

    def __init__(self, key: str):
        self.key = key

    @classmethod
    def for_load(cls, core_sha256: bytes, handles: Iterable, sizes: tuple[int, ...]) -> "DryRunRecord | None":
        """The record of a load of the core whose body has `core_sha256`, selecting the programs of
        `handles` (GraphHandle messages), with `sizes` (what its buffers' sizes follow from: the
        concurrency, the context, ...); None without Triton. Made before the load touches the device."""
        try:
            fingerprint = _install_fingerprint()
        except ImportError:  # no Triton: nothing compiles, nothing to record
            return None
        digest = hashlib.sha256()
        for part in (str(FORMAT).encode(), core_sha256, *_handle_bytes(handles), repr(tuple(sizes)).encode(),
                     fingerprint):
            digest.update(len(part).to_bytes(8, "little") + part)
        return cls(digest.hexdigest())

    def exists(self) -> bool:
        """Whether a record is kept under this key (its file is there; not read)."""
        try:
            from triton.runtime.cache import get_cache_manager

            return get_cache_manager(self.key).get_file(FILENAME) is not None
        except Exception as error:  # noqa: BLE001 - no cache to read: no record
            _LOG.debug("no dry-run record: %s: %s", type(error).__name__, error)
            return False

    def all_on_disk(self, device: torch.device) -> int | None:
        """How many variants the record lists, where it was made on a GPU like `device` (its name and
        multiprocessor count, which kernels' splits follow), every one is for `device`'s target and
        in Triton's cache (0 for a dry run that found none); None where there is no readable record,
        or one is not, or the device cannot be told."""
        read = self._read()
        if read is None:
            return None
        jobs, made_on = read
        try:
            target, identity = _target(device), _device_identity(device)
        except Exception as error:  # noqa: BLE001 - a device Triton cannot tell: no record, the dry run runs
            _LOG.info("the dry-run record is not used (%s: %s)", type(error).__name__, error)
            return None
        if made_on != identity:
            _LOG.info("the last dry run ran on %s, not on this %s: the dry run runs", made_on, identity)
            return None
        for job in jobs:
            if job.target != target:
                _LOG.info("the last dry run's Triton variants are for %s, not this device's %s: the dry run runs",
                          job.target, target)
                return None
            if not cached_on_disk(job):
                _LOG.info("Triton variant %s of the last dry run is not in Triton's cache: the dry run runs",
                          job.kernel)
                return None
        return len(jobs)

    def save(self, jobs: Iterable[CompileJob], device: torch.device) -> bool:
        """Writes the record of a dry run on `device` that found `jobs`; False (logged) where a job's
        values are not Python literals or the cache cannot be written."""
        entries = []
        for job in jobs:
            entry = _encoded(job)
            if entry is None:
                _LOG.info("no dry-run record kept: variant %s has values that are not Python literals", job.kernel)
                return False
            entries.append(entry)
        try:
            from triton.runtime.cache import get_cache_manager

            text = json.dumps({"format": FORMAT, "device": _device_identity(device), "jobs": entries})
            get_cache_manager(self.key).put(text, FILENAME, binary=False)
        except Exception as error:  # noqa: BLE001 - only the next load's time depends on it
            _LOG.info("no dry-run record kept (%s: %s)", type(error).__name__, error)
            return False
        return True

    def _read(self) -> tuple[list[CompileJob], list] | None:
        try:
            from triton.runtime.cache import get_cache_manager

            path = get_cache_manager(self.key).get_file(FILENAME)
            if path is None:
                return None
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("jobs"), list):
                raise ValueError("not a record of this format")
            return [_decoded(entry) for entry in data["jobs"]], data.get("device")
        except Exception as error:  # noqa: BLE001 - a record that cannot be read is no record
            _LOG.info("the dry-run record cannot be read (%s: %s): the dry run runs", type(error).__name__, error)
            return None


def _handle_bytes(handles: Iterable) -> list[bytes]:
    return [handle.SerializeToString(deterministic=True) for handle in handles]


def _device_identity(device: torch.device) -> list:
    """The GPU as kernels' variants follow it: its name, compute capability and multiprocessor count
    (a JSON list, as the record keeps it)."""
    properties = torch.cuda.get_device_properties(device)
    return [properties.name, properties.major, properties.minor, properties.multi_processor_count]


def _target(device: torch.device):
    """Triton's target (`GPUTarget`) of the CUDA `device`, as its JIT compiles for it."""
    from triton.runtime.driver import driver

    with torch.cuda.device(device):
        return driver.active.get_current_target()


def _install_fingerprint() -> bytes:
    """This install: the versions of Python, torch and Triton, the `TRITON_*` environment, and each file
    of the helios package by path, size and modification time (an edited or upgraded kernel, or a
    rewrite that launches others, names another record)."""
    import triton

    root = Path(helios.__file__).parent
    parts = [sys.version, torch.__version__, triton.__version__,
             repr(sorted((name, value) for name, value in os.environ.items() if name.startswith("TRITON_")))]
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            stat = path.stat()
            parts.append(f"{path.relative_to(root)}:{stat.st_size}:{stat.st_mtime_ns}")
    return "\n".join(parts).encode("utf-8", "surrogateescape")


def _encoded(job: CompileJob) -> dict | None:
    """`job` as JSON of Python literals (its target as backend, arch and warp size), or None where a
    value does not read back as itself."""
    fields = {"signature": job.signature, "constexprs": job.constexprs, "attrs": job.attrs, "options": job.options}
    encoded = {name: repr(value) for name, value in fields.items()}
    try:
        if any(ast.literal_eval(encoded[name]) != value for name, value in fields.items()):
            return None
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    target = job.target
    return {"module": job.module, "name": job.name, **encoded,
            "target": [target.backend, target.arch, target.warp_size]}


def _decoded(entry: dict) -> CompileJob:
    from triton.backends.compiler import GPUTarget

    backend, arch, warp_size = entry["target"]
    return CompileJob(str(entry["module"]), str(entry["name"]),
                      *(ast.literal_eval(entry[name]) for name in ("signature", "constexprs", "attrs", "options")),
                      GPUTarget(backend, arch, warp_size))
