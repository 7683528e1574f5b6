"""Inductor's vector instruction set for the C++ CPU kernels: probed by a machine's first process,
recorded, and taken from the record by the next one without the per-set probes' child processes
(`helios.runtime.loading.vector_isa`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from torch._inductor import config

from helios.runtime.loading import vector_isa

# A process's first kernel build, counting the probes' loads (a child Python each); the record at argv[1].
FIRST_BUILD = """
import json, subprocess, sys
from pathlib import Path

from helios.runtime.loading import vector_isa

vector_isa._record_path = lambda compiler: Path(sys.argv[1])
loads = []
for name in ("run", "check_call"):  # torch 2.13 probes with run, 2.11 with check_call
    def counted(command, *args, _call=getattr(subprocess, name), **kwargs):
        loads.extend(1 for part in command if "LoadLibrary" in str(part))
        return _call(command, *args, **kwargs)
    setattr(subprocess, name, counted)

from helios.runtime.loading import cache_write_kernel
from helios.runtime.loading.cpp_kernels import build_cpp_kernel
from torch._inductor.cpu_vec_isa import pick_vec_isa

build_cpp_kernel(cache_write_kernel._ARGUMENT_TYPES, cache_write_kernel.KERNEL_SOURCE)
print(json.dumps({"probe_loads": len(loads), "picked": str(pick_vec_isa())}))
"""


def first_build(record) -> dict:
    # tests/conftest.py turns the probes off for the processes the tests start: this one probes as a user's would
    env = {name: value for name, value in os.environ.items() if name != "TORCHINDUCTOR_VEC_ISA_OK"}
    done = subprocess.run([sys.executable, "-c", FIRST_BUILD, str(record)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_recorded_pick_is_taken_without_probes_and_a_wrong_one_is_probed_again(tmp_path):
    record = tmp_path / "record"
    record.write_text("avx9000\n")  # a set Inductor never picks: probed again, and the pick recorded anew
    probed = first_build(record)
    assert probed["probe_loads"] > 0
    assert record.read_text().strip() == probed["picked"] != "avx9000"
    recorded = first_build(record)  # the next process: the recorded pick, fewer probes loaded
    assert recorded["picked"] == probed["picked"]
    # (AVX-512 VNNI's extra check and AVX-512's bfloat16 one probe whatever the setting; the per-set probes go)
    assert recorded["probe_loads"] < probed["probe_loads"]


def test_nothing_is_recorded_where_the_user_set_the_probes_or_there_is_no_compiler(tmp_path, monkeypatch):
    monkeypatch.setattr(vector_isa, "_record_path", lambda compiler: tmp_path / "record")
    monkeypatch.setattr(config.cpp, "vec_isa_ok", False)
    assert vector_isa._settle("/usr/bin/c++") is None
    monkeypatch.setattr(config.cpp, "vec_isa_ok", None)
    assert vector_isa._settle(None) is None
    monkeypatch.setattr(config.cpp, "simdlen", 256)
    assert vector_isa._settle("/usr/bin/c++") is None
    assert not (tmp_path / "record").exists()


def test_the_record_is_named_for_the_compiler_and_the_cpu_capability(tmp_path, monkeypatch):
    first, second = tmp_path / "c++", tmp_path / "g++"
    first.write_text("a")
    second.write_text("bb")
    named = vector_isa._record_path(str(first))
    assert vector_isa._record_path(str(second)) != named
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert vector_isa._record_path(str(first)) != named
