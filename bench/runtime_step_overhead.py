"""Host overhead per scheduler step against the program's own execution time (not a test).

Prepares a tiny random Qwen3-shaped model with decode variants at 1, 64 and 256 rows, then for each
concurrency runs that many requests to completion through the engine and splits every step into
host work (schedule + complete, packing) and program execution. Prints medians and the ratio
host / program per step.

    .venv/bin/python bench/runtime_step_overhead.py [--tokens 32]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helios.core.keys import SigningKey  # noqa: E402
from helios.core.reader import open_core  # noqa: E402
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core  # noqa: E402
from helios.runtime.offline import generate  # noqa: E402
from helios.runtime.service import build_runtime  # noqa: E402
from ignition.hf_checkpoints import QWEN3  # noqa: E402
from support.chat_checkpoint import write_chat_checkpoint  # noqa: E402


class Timed:
    """Wraps a bound method, accumulating its wall time per call into `samples`."""

    def __init__(self, owner, name: str, samples: list[float]):
        self.inner = getattr(owner, name)
        self.samples = samples
        setattr(owner, name, self)

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.inner(*args, **kwargs)
        finally:
            self.samples.append(time.perf_counter() - start)


def measure(core_path: Path, key: SigningKey, lanes: int, tokens: int) -> dict[str, float]:
    runtime = build_runtime(open_core(core_path, accept="bench/tiny", trusted_keys=[key.public]))
    engine = runtime.engine
    schedule, complete, pack, program = [], [], [], []
    Timed(engine.scheduler, "schedule", schedule)
    Timed(engine.scheduler, "complete", complete)
    Timed(engine.executor.packer, "pack", pack)
    for loaded in runtime.model.programs:
        object.__setattr__(loaded, "module", _timed_module(loaded.module, program))
    prompts = [[(i * 7 + j) % 300 + 3 for j in range(8)] for i in range(lanes)]
    generate(engine, prompts, tokens)
    host = [s + c + p for s, c, p in zip(schedule, complete, pack)]
    return {
        "steps": len(program),
        "host_us": statistics.median(host) * 1e6,
        "program_us": statistics.median(program) * 1e6,
        "ratio": statistics.median(host) / statistics.median(program),
    }


def _timed_module(module, samples):
    def call(*args):
        start = time.perf_counter()
        try:
            return module(*args)
        finally:
            samples.append(time.perf_counter() - start)
    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32, help="tokens generated per request")
    args = parser.parse_args()
    torch.set_num_threads(1)
    key = SigningKey.generate()
    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = write_chat_checkpoint(QWEN3, Path(scratch) / "ckpt", seed=1)
        core = Path(scratch) / "tiny.core"
        plan = CapacityPlan(page_tokens=16, context_tokens=64, prefill_tokens=64, decode_batches=(1, 64, 256),
                            prefill_batches=(1,), mixed=True)
        prepare_core(checkpoint, core, key, PrepareOptions("bench/tiny", capacities=plan))
        print(f"torch {torch.__version__}, 1 thread; tiny model: 2 layers, hidden 64, vocab 320")
        print("lanes  steps  host us/step  program us/step  host/program")
        for lanes in (1, 64, 256):
            r = measure(core, key, lanes, args.tokens)
            print(f"{lanes:5d}  {r['steps']:5d}  {r['host_us']:12.0f}  {r['program_us']:15.0f}  {r['ratio']:13.2f}")


if __name__ == "__main__":
    main()
