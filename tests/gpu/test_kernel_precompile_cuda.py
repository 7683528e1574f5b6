"""The load's Triton precompile on CUDA (`helios.runtime.loading.kernel_precompile`): a bfloat16 core
loaded in fresh processes, each with an empty Triton cache, with compile workers and without. The
greedy tokens are the same; with workers, the variants were compiled by them, and the warm-up runs
compiled none that had not been sent to one (the dry run found every variant the capture needs).
Llama 4 too: its programs give step constants (``ones`` MoE combine weights, a position-free layer's
rotary table; every family's ``True`` grammar-mask rows of its sampled programs) to Triton launches
that a cold dry run skips, and that once zeroed them for good: the graph modules' own tensors are the
same after the load as when they were built."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helios.core.keys import SigningKey
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core
from ignition.hf_checkpoints import LLAMA3, LLAMA4
from support.chat_checkpoint import write_chat_checkpoint

pytestmark = pytest.mark.gpu
NAMESPACE = "test.helios/precompile"
PROMPTS = [[5, 9, 11], list(range(3, 70)), [7] * 20]
TESTS = Path(__file__).resolve().parents[1]


def _load(core: Path, key: SigningKey, workers: int, cache: Path) -> dict:
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache),
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "support.precompile_load", str(core), key.public.raw.hex(),
                           NAMESPACE, str(workers), json.dumps(PROMPTS), "12"],
                          capture_output=True, text=True, env=env, timeout=400)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("family", [LLAMA3, LLAMA4], ids=lambda family: family.name)
def test_workers_compile_what_the_capture_needs_and_the_tokens_do_not_change(tmp_path: Path, family):
    key = SigningKey.generate()
    checkpoint, core = tmp_path / "llama", tmp_path / "llama.core"
    write_chat_checkpoint(family, checkpoint, seed=5)
    plan = CapacityPlan(context_tokens=256, prefill_tokens=64, decode_batches=(1, 4))
    prepare_core(checkpoint, core, key, PrepareOptions(NAMESPACE, dtype="bfloat16", capacities=plan))
    parallel = _load(core, key, 2, tmp_path / "cache-workers")
    serial = _load(core, key, 0, tmp_path / "cache-serial")
    assert parallel["captured"] and serial["captured"]
    assert parallel["tokens"] == serial["tokens"]
    report = parallel["report"]
    assert report["variants"] > 0 and report["failed"] == [] and report["skipped_launches"] > 0
    assert parallel["unsent_after_wait"] == []
    assert serial["report"] is None  # no workers: no dry run
    assert parallel["held"] > 0 and parallel["held_changed"] == 0  # the dry run left the modules' constants


def test_a_later_load_skips_the_dry_run_while_every_variant_it_found_is_on_disk(tmp_path: Path):
    """`helios.runtime.loading.dry_run_record`: the first load's dry run is written down; the next load
    of the core on that cache makes none and gives the same tokens; with one variant gone from the
    cache, the dry run runs again and compiles just that one."""
    key = SigningKey.generate()
    checkpoint, core = tmp_path / "llama", tmp_path / "llama.core"
    write_chat_checkpoint(LLAMA3, checkpoint, seed=5)
    plan = CapacityPlan(context_tokens=256, prefill_tokens=64, decode_batches=(1, 4))
    prepare_core(checkpoint, core, key, PrepareOptions(NAMESPACE, dtype="bfloat16", capacities=plan))
    cache = tmp_path / "cache"
    first = _load(core, key, 2, cache)
    assert first["report"]["variants"] > 0 and len(list(cache.rglob("helios-dry-run.json"))) == 1
    second = _load(core, key, 2, cache)
    assert second["report"] is None and second["tokens"] == first["tokens"]  # no dry run, no compile awaited
    shutil.rmtree(next(cache.rglob("*.cubin")).parent)  # one variant's compiled files
    third = _load(core, key, 2, cache)
    assert third["report"]["variants"] == 1 and third["report"]["failed"] == []
    assert third["tokens"] == first["tokens"] and third["unsent_after_wait"] == []
