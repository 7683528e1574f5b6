"""Host cost of packing one admitting prefill step (the work between a request's admission and its
prefill program's launch), on the CPU: a 2,048-token prompt with the 8B vocabulary's 128,256
histogram bins, greedy and with a repetition penalty, into host buffers (the CPU path) and into
``meta`` buffers standing for a device (the staged device path: pinned-style mirrors, staged
histogram rows; no device work is timed, only what the host does).

Prepares a tiny Llama-shaped core with the 8B vocabulary (a few seconds), loads it on the CPU and
times ``Packer.apply`` + ``Packer.pack`` of a cold (2,048 packed tokens) and a 90%-cached (208
packed tokens, 1,840 reused) admission, median microseconds over ``--repeats``.

    PYTHONPATH=src:tests python bench/admission_packing.py [--repeats 200] [--prompt 2048]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from random_llama import SMOKE  # noqa: E402
from ttft_breakdown import prepared_core, prompt  # noqa: E402

from helios.contract import StartupOptions  # noqa: E402
from helios.runtime.execution.packer import Packer  # noqa: E402
from helios.runtime.loading.model import LoadOptions  # noqa: E402
from helios.runtime.records.capacities import Operation  # noqa: E402
from helios.runtime.records.plan import PlanRow, StepPlan  # noqa: E402
from helios.runtime.records.request import RequestSpec  # noqa: E402
from helios.runtime.records.sampling_params import SamplingParams  # noqa: E402
from helios.runtime.service import RuntimeOptions, build_runtime  # noqa: E402

VOCAB = 128256
PENALISED = SamplingParams(repetition_penalty=1.1)


def admission(prompt_ids: tuple[int, ...], reused: int, sampling: SamplingParams, serial: int) -> StepPlan:
    """A one-row prefill plan admitting a request whose first `reused` tokens came from the cache."""
    spec = RequestSpec(f"r{serial}", prompt_ids, 16, frozenset({VOCAB - 1}), sampling=sampling)
    pages = tuple(range(-(-len(prompt_ids) // 16)))
    tokens = prompt_ids[reused:]
    row = PlanRow(spec.request_id, 0, serial, tokens, False, reused, len(tokens), 0, pages, True, 0, 1, True, False)
    return StepPlan(serial, serial % 2, Operation.PREFILL, None, (row,), (), len(tokens), admitted=(spec,))


def time_packing(packer: Packer, length: int, reused: int, sampling: SamplingParams, repeats: int) -> float:
    """Median microseconds of apply + pack of one admitting plan (the request forgotten after)."""
    samples = []
    for serial in range(repeats + 3):
        plan = admission(tuple(prompt(length, VOCAB, serial)), reused, sampling, serial)
        start = time.perf_counter()
        packer.apply(plan)
        packer.pack("prefill", plan)
        samples.append(time.perf_counter() - start)
        packer.forget(plan.rows[0].request_id)
    return statistics.median(samples[3:]) * 1e6


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--prompt", type=int, default=2048)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        shape = replace(SMOKE, vocab_size=VOCAB)
        opened = prepared_core(Path(scratch), shape, args.prompt, (128, 256, 512), torch.device("cpu"))
        runtime = build_runtime(opened, RuntimeOptions(load=LoadOptions(StartupOptions(token_logprobs=False),
                                                                        device="cpu")))
        try:
            prepared, host = runtime.model.prepared, runtime.model.buffers
            meta = {name: torch.empty_like(tensor, device="meta") for name, tensor in host.items()}
            cases = {"host buffers (CPU path)": Packer(prepared, host),
                     "meta buffers (device path)": Packer(prepared, meta)}
            reused = int(args.prompt * 0.9) // 16 * 16
            for label, packer in cases.items():
                for kind, skip in (("cold", 0), ("cached", reused)):
                    greedy = time_packing(packer, args.prompt, skip, SamplingParams(), args.repeats)
                    penalised = time_packing(packer, args.prompt, skip, PENALISED, args.repeats)
                    print(f"{label:<28} {kind:<6} ({args.prompt - skip:4d} packed): greedy {greedy:7.1f} us, "
                          f"repetition penalty {penalised:7.1f} us per admission (median of {args.repeats})",
                          flush=True)
        finally:
            runtime.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
