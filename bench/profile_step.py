"""Where a serving step's time goes on a GPU: captured-graph replay time per program against the
engine's wall time per step, and the eager program's kernels by device time (torch profiler).

    python bench/profile_step.py [--layers 4] [--batch 64] [--rows 30]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from gpu_serving import NAMESPACE, Workload, log, prepare, run_helios  # noqa: E402
from random_llama import LLAMA_31_8B, with_layers  # noqa: E402

from helios.core.keys import SigningKey  # noqa: E402
from helios.core.reader import open_core  # noqa: E402
from helios.runtime.loading.model import LoadOptions, program_arguments  # noqa: E402
from helios.runtime.service import RuntimeOptions, build_runtime  # noqa: E402


def replay_ms(program, arguments, repeat: int = 50) -> float:
    """Median device time of one call of `program` (a captured graph replay or an eager call)."""
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        program.module(*arguments)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rows", type=int, default=30, help="kernels listed by the profiler")
    args = parser.parse_args()
    shape = with_layers(LLAMA_31_8B, args.layers)
    workloads = [Workload(1, 128, 64), Workload(args.batch, 128, 64)]
    key = SigningKey.generate()
    with tempfile.TemporaryDirectory() as scratch:
        core = prepare(shape, workloads, Path(scratch), key, "bfloat16", 256, torch.device("cuda"))
        for graphs in (True, False):
            runtime = build_runtime(open_core(core, accept=NAMESPACE, trusted_keys=[key.public]),
                                    RuntimeOptions(load=LoadOptions(device="cuda", cuda_graphs=graphs)))
            model = runtime.model
            for workload in workloads:
                started = time.perf_counter()
                result = run_helios(runtime.engine, workload, shape.vocab_size)
                steps = workload.output  # one decode step per output token after the prefill
                log(f"graphs={graphs} {workload}: {result['decode_tokens_per_s']:.0f} decode tok/s, "
                    f"{1e3 * workload.requests / result['decode_tokens_per_s']:.2f} ms per decode step "
                    f"({time.perf_counter() - started:.1f} s, {steps} steps)")
            if graphs:  # host side of the batch workload, the device wait included where it blocks
                import cProfile
                import pstats

                profiler = cProfile.Profile()
                profiler.enable()
                run_helios(runtime.engine, workloads[1], shape.vocab_size, salt=5)
                profiler.disable()
                pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
            for program in model.programs:
                ms = replay_ms(program, program_arguments(program, model.weights, model.buffers))
                log(f"graphs={graphs} {program.graph} R={program.batch_capacity} T={program.packed_token_capacity}: "
                    f"{ms:.3f} ms device time per call")
            if not graphs:
                decode = next(p for p in model.programs if p.graph == "decode" and p.batch_capacity == args.batch)
                arguments = program_arguments(decode, model.weights, model.buffers)
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA,
                                                        torch.profiler.ProfilerActivity.CPU]) as profile:
                    for _ in range(5):
                        decode.module(*arguments)
                    torch.cuda.synchronize()
                print(profile.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows), flush=True)
            runtime.close()


if __name__ == "__main__":
    main()
