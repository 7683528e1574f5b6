"""The record of a load's Triton dry run (`helios.runtime.loading.dry_run_record`): a real Helios kernel's
compile job (sm_90, no device) written into Triton's cache and read back, the cache lookups that decide
whether a later load skips its dry run, what names a record, and records that cannot be written or read."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from helios.contract import manifest_pb2 as mpb
from helios.runtime.loading import dry_run_record, kernel_precompile
from helios.runtime.loading.dry_run_record import FILENAME, DryRunRecord
from helios.runtime.loading.kernel_precompile import KernelCompiler
from runtime.test_kernel_precompile import StandInJit, _launch, _silu_mul_job, stand_in_kernel

DEVICE = torch.device("cuda", 0)
SIZES = (4, 256, 0, 0)


def _handle(graph: str, batch: int) -> mpb.GraphHandle:
    handle = mpb.GraphHandle(graph=graph, resource_id=f"program/{graph}/{batch}")
    handle.capacity.batch_capacity = batch
    return handle


HANDLES = [_handle("decode", 1), _handle("decode", 4), _handle("prefill", 1)]
H200 = ("NVIDIA H200", 9, 0, 132)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    return tmp_path


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    """A Triton cache holding the job's variant, compiled once by a compile worker (a spawned process:
    a process whose tests turned Triton's interpreter on cannot compile it itself)."""
    directory, job = tmp_path_factory.mktemp("compiled"), _silu_mul_job()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_CACHE_DIR", str(directory))  # the worker takes the load's Triton environment
        patch.delenv("TRITON_INTERPRET", raising=False)
        with KernelCompiler(1) as compiler:
            compiler.start()
            assert compiler.submit(job, ("silu",))
            assert compiler.wait()["failed"] == []
    return directory


def _compile(job, cache: Path, compiled: Path) -> None:
    """`job`'s variant into `cache`, as a worker compiles it (`compiled`'s files)."""
    shutil.copytree(compiled, cache, dirs_exist_ok=True)
    assert kernel_precompile.cached_on_disk(job)


@pytest.fixture
def job(cache, monkeypatch):
    job = _silu_mul_job()
    monkeypatch.setattr(dry_run_record, "_target", lambda device: job.target)  # this device is an H200
    monkeypatch.setattr(dry_run_record, "_device_identity", lambda device: list(H200))
    return job


def _record(core: bytes = b"\x01" * 32, handles=HANDLES, sizes=SIZES) -> DryRunRecord:
    return DryRunRecord.for_load(core, handles, sizes)


def test_a_record_is_read_back_as_the_jobs_written_and_counts_only_when_every_variant_is_on_disk(job, cache, compiled):
    record = _record()
    assert not record.exists() and record.all_on_disk(DEVICE) is None
    assert record.save([job], DEVICE)
    assert record.exists() and len(list(cache.rglob(FILENAME))) == 1
    assert _record()._read() == ([job], list(H200))  # the same key, another object: the job as it was, its target too
    assert record.all_on_disk(DEVICE) is None  # listed, but not compiled: the dry run runs
    _compile(job, cache, compiled)  # as a worker compiles it, into the same cache
    assert record.all_on_disk(DEVICE) == 1
    assert DryRunRecord.for_load(b"\x01" * 32, HANDLES, SIZES).all_on_disk(DEVICE) == 1


def test_a_variant_for_another_target_is_not_this_devices(job, monkeypatch, cache, compiled):
    record = _record()
    _compile(job, cache, compiled)
    assert record.save([job], DEVICE) and record.all_on_disk(DEVICE) == 1
    from triton.backends.compiler import GPUTarget

    monkeypatch.setattr(dry_run_record, "_target", lambda device: GPUTarget("cuda", 80, 32))
    assert record.all_on_disk(DEVICE) is None


def test_a_dry_run_that_found_nothing_records_that_nothing_is_to_compile(job):
    record = _record()
    assert record.save([], DEVICE) and record.all_on_disk(DEVICE) == 0


def test_the_key_follows_the_core_its_programs_their_sizes_and_the_install(job, monkeypatch):
    keys = {_record().key, _record(core=b"\x02" * 32).key, _record(handles=HANDLES[:2]).key,
            _record(handles=[*HANDLES[:2], _handle("prefill", 2)]).key, _record(sizes=(4, 512, 0, 0)).key}
    assert len(keys) == 5 and _record().key == _record().key
    monkeypatch.setenv("TRITON_SOMETHING", "1")  # a Triton setting may change what compiles
    assert _record().key not in keys
    monkeypatch.delenv("TRITON_SOMETHING")
    monkeypatch.setattr(dry_run_record, "_install_fingerprint", lambda: b"another install")
    assert _record().key not in keys


def test_an_edited_helios_file_names_another_install(tmp_path: Path, monkeypatch):
    package = tmp_path / "helios"
    package.mkdir()
    (package / "__init__.py").write_text("")
    kernel = package / "kernel.py"
    kernel.write_text("BLOCK = 16\n")
    monkeypatch.setattr(dry_run_record.helios, "__file__", str(package / "__init__.py"))
    before = dry_run_record._install_fingerprint()
    kernel.write_text("BLOCK = 32\n")
    os.utime(kernel, ns=(1, 1))
    assert dry_run_record._install_fingerprint() != before


@pytest.mark.parametrize("text", ["", "{", "[]", json.dumps({"format": 99, "jobs": []}),
                                  json.dumps({"format": 1, "jobs": [{"module": "x"}]}),
                                  json.dumps({"format": 1, "jobs": [{"module": "m", "name": "n", "signature": "__import__('os')",
                                                                     "constexprs": "{}", "attrs": "{}", "options": "{}",
                                                                     "target": ["cuda", 90, 32]}]})])
def test_a_record_that_cannot_be_read_is_no_record(job, text):
    """Damaged, of another format, or holding code where literals belong: the dry run runs, the load never fails."""
    record = _record()
    from triton.runtime.cache import get_cache_manager

    get_cache_manager(record.key).put(text, FILENAME, binary=False)
    assert record.exists() and record.all_on_disk(DEVICE) is None


def test_a_job_whose_values_are_not_literals_is_not_recorded(job):
    record = _record()
    odd = dataclasses.replace(job, constexprs={(4,): object()})
    assert not record.save([job, odd], DEVICE) and not record.exists()


def test_a_cache_that_cannot_be_written_fails_no_load(tmp_path: Path, monkeypatch, job):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(blocked))
    record = _record()
    assert not record.save([job], DEVICE) and not record.exists() and record.all_on_disk(DEVICE) is None


def test_the_dry_run_reveals_the_variants_it_sends_and_those_on_disk_already(monkeypatch):
    """What a record lists: every variant the dry run met, the ones loaded from the cache included."""
    stand_in_kernel.__init__("stand_in_kernel")
    monkeypatch.setattr(kernel_precompile, "_launch_key", lambda fn, args, kwargs: kwargs.get("BLOCK", 0))
    monkeypatch.setattr(kernel_precompile, "cached_on_disk", lambda job: job.constexprs == {(1,): 32})
    compiler = KernelCompiler(1, executor=ThreadPoolExecutor(1))
    with kernel_precompile._patched(StandInJit, compiler, threading.get_ident(), set()):
        _launch(stand_in_kernel, block=16)  # sent to the worker
        _launch(stand_in_kernel, block=32)  # on disk: loaded here
        _launch(stand_in_kernel, block=16)  # again: one variant
    assert sorted(job.constexprs[(1,)] for job in compiler.revealed.values()) == [16, 32]
    assert compiler.wait()["variants"] == 1


def test_workers_of_a_load_that_expects_to_compile_nothing_wait_to_be_asked_for(monkeypatch):
    pytest.importorskip("triton")
    spawned, asked = [], threading.Event()
    monkeypatch.setattr(kernel_precompile, "_COMPILED_HERE", False)
    monkeypatch.setattr(kernel_precompile, "_spawn_niced", lambda pool, workers: (spawned.append(workers), asked.set()))
    monkeypatch.setattr(kernel_precompile, "_triton_key", lambda: None)
    with KernelCompiler(2) as compiler:
        compiler.start(spawn=False)
        assert compiler.active and spawned == []
        compiler.spawn_workers()
        compiler.spawn_workers()  # once
        assert asked.wait(10)
    assert spawned == [2]


def test_a_record_made_on_another_gpu_of_the_same_target_is_not_this_ones(job, monkeypatch, cache, compiled):
    """An H100 and an H200 are both sm_90, but kernels' splits follow the multiprocessor count."""
    record = _record()
    _compile(job, cache, compiled)
    assert record.save([job], DEVICE) and record.all_on_disk(DEVICE) == 1
    monkeypatch.setattr(dry_run_record, "_device_identity", lambda device: ["NVIDIA H100 80GB HBM3", 9, 0, 132])
    assert record.all_on_disk(DEVICE) is None


def test_a_device_triton_cannot_tell_uses_no_record(job, monkeypatch):
    record = _record()
    assert record.save([], DEVICE) and record.all_on_disk(DEVICE) == 0

    def no_driver(device):
        raise RuntimeError("0 active drivers ([]). There should only be one.")

    monkeypatch.setattr(dry_run_record, "_target", no_driver)
    assert record.all_on_disk(DEVICE) is None


def test_without_triton_a_load_makes_no_record(monkeypatch):
    for name in [m for m in sys.modules if m == "triton" or m.startswith("triton.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError
    assert DryRunRecord.for_load(b"\0" * 32, HANDLES, SIZES) is None
