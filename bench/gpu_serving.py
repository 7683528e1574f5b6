"""Serving benchmark on one GPU: Helios against Hugging Face `transformers` and the bandwidth roofline.

Builds a random Llama-3.1-8B-shaped checkpoint in bf16 (`bench/random_llama.py`; `--layers` makes
it shallower for quick runs), prepares it into a core, loads it on the device with CUDA graphs, and
runs, in this one process:

- decode workloads: N concurrent requests of P prompt tokens and O output tokens, greedy, ignoring
  EOS; Helios output tokens/s over the whole run (prefill included) and its steady decode rate;
- the same workloads through `transformers` `generate` on the same weights (bf16, SDPA, its
  default dynamic cache), skipped above `--hf-max-batch`;
- the roofline: the fewest bytes a decode step must read (every weight once, plus the KV of every
  live token, at the workload's mean context) over the device-to-device copy bandwidth measured
  here, as output tokens/s;
- time to first token of a 2,048-token prompt, and of one whose first 90% is in the prefix cache.

Prints one table with the ratios (Helios / transformers, Helios / roofline); `--json PATH` also
writes every number. `--smoke` runs tiny shapes on the CPU to check the script itself.

    python bench/gpu_serving.py [--layers 32] [--workloads 1x128x128,64x128x128,256x128x128] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from random_llama import LLAMA_31_8B, SMOKE, LlamaShape, with_layers, write_random_llama  # noqa: E402

from helios.core.keys import SigningKey  # noqa: E402
from helios.core.reader import open_core  # noqa: E402
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core  # noqa: E402
from helios.runtime.engine import EngineRequest  # noqa: E402
from helios.runtime.records.events import TokenEvent  # noqa: E402
from helios.runtime.loading.model import LoadOptions  # noqa: E402
from helios.runtime.records.request import RequestSpec  # noqa: E402
from helios.runtime.service import RuntimeOptions, build_runtime  # noqa: E402

NAMESPACE = "bench/gpu"


@dataclass(frozen=True)
class Workload:
    requests: int
    prompt: int
    output: int

    @classmethod
    def parse(cls, text: str) -> "Workload":
        requests, prompt, output = (int(part) for part in text.split("x"))
        return cls(requests, prompt, output)

    def __str__(self) -> str:
        return f"{self.requests} x {self.prompt}/{self.output}"

    def prompts(self, vocab: int, salt: int = 0) -> list[list[int]]:
        return [[(r * 7919 + i * 31 + salt) % (vocab - 16) + 16 for i in range(self.prompt)] for r in range(self.requests)]


def log(line: str) -> None:
    print(line, flush=True)


def log_memory(device: torch.device, what: str) -> None:
    """Logs the allocator's view of `device`'s memory (allocated, reserved, peak) and its free memory."""
    free, total = torch.cuda.mem_get_info(device)
    log(f"{what}: {torch.cuda.memory_allocated(device) / 2**30:.2f} GiB allocated, "
        f"{torch.cuda.memory_reserved(device) / 2**30:.2f} reserved, peak {torch.cuda.max_memory_allocated(device) / 2**30:.2f}; "
        f"{free / 2**30:.2f} of {total / 2**30:.2f} GiB free")


def copy_bandwidth(device: torch.device) -> float:
    """Bytes/s of a large device-to-device copy (bytes read plus bytes written), median of 20."""
    if device.type != "cuda":
        return float("nan")
    source = torch.randn(1 << 28, device=device)  # 1 GiB
    target = torch.empty_like(source)
    times = []
    for _ in range(25):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        target.copy_(source)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del source, target
    return 2 * (1 << 30) / sorted(times[5:])[len(times[5:]) // 2]


def submit_greedy(engine, request_id: str, prompt: list[int], output: int, record, observe: bool = False) -> None:
    """One greedy request of exactly `output` tokens (EOS ignored), events to `record`; with `observe`,
    its token events carry the engine's step-completion clock (`TokenEvent.observed_ns`)."""
    spec = RequestSpec(request_id, tuple(prompt), output, frozenset(), observe=observe)
    engine.submit(EngineRequest(spec, record))


def window_rates(stamps: dict[str, list[float]]) -> dict:
    """Decode rates from each request's token times: from the last request's first token to the
    last token (``decode``), and over the steps where every request decodes, from the last first
    token to the first request's last (``full``): the batch is then exactly its request count, as
    in a fixed-batch decode loop."""
    first = max(s[0] for s in stamps.values())  # every request is decoding from here on
    last = max(s[-1] for s in stamps.values())
    full_end = min(s[-1] for s in stamps.values())
    decoded = sum(sum(1 for t in s if t > first) for s in stamps.values())
    full = sum(sum(1 for t in s if first < t <= full_end) for s in stamps.values())
    return {"decode": decoded / (last - first) if last > first else float("nan"),
            "full": full / (full_end - first) if full_end > first else float("nan"),
            "first": first, "full_end": full_end}


def run_helios(engine, workload: Workload, vocab: int, salt: int = 0, rest_s: float = 0.0,
               on_rested=lambda: None) -> dict:
    """Submits every request of `workload`, runs to idle; output tokens/s and steady decode rate.

    Each token is timed by the engine's clock read when its step's completion is validated (one
    read a step, shared by every row: `RequestSpec.observe`), so a window from one step's tokens
    to a later step's holds whole steps, as a timed loop of decode steps does. The previous measure
    timed each token when its event reached this callback: the 256 events of a step arrive spread
    over the step's dispatch, the window then opened after the last row's first token and closed at
    the first row's last token, one step's tokens short (``*_callback_*`` keeps it).

    With `rest_s`, the engine pauses that long once every request has its first token (the device
    idles and leaves its power cap, as a script that compiles between prefill and a timed decode
    loop lets it), then `on_rested()` runs, and ``rested_decode_tokens_per_s`` is the all-rows-live
    rate of the steps launched after the pause (from every row's third token after it: the frames
    in flight during the pause are not counted)."""
    stamps: dict[str, list[float]] = {}
    arrivals: dict[str, list[float]] = {}
    started_rows, rested = [0], []

    def record(event) -> None:
        if isinstance(event, TokenEvent):
            own = stamps[event.request_id]
            if not own:
                started_rows[0] += 1
            arrived = time.monotonic()
            own.extend([event.observed_ns / 1e9] * len(event.token_ids))
            arrivals[event.request_id].extend([arrived] * len(event.token_ids))
            if rest_s and not rested and started_rows[0] == len(stamps):
                time.sleep(rest_s)
                rested.append(time.monotonic())
                on_rested()

    start = time.monotonic()
    for index, prompt in enumerate(workload.prompts(vocab, salt)):
        request_id = f"w{salt}-{index}"
        stamps[request_id], arrivals[request_id] = [], []
        submit_greedy(engine, request_id, prompt, workload.output, record, observe=True)
    engine.run_until_idle()
    elapsed = time.monotonic() - start
    tokens = sum(len(s) for s in stamps.values())
    rates, callback = window_rates(stamps), window_rates(arrivals)
    result = {"tokens": tokens, "seconds": elapsed, "tokens_per_s": tokens / elapsed,
              "decode_tokens_per_s": rates["decode"], "full_batch_decode_tokens_per_s": rates["full"],
              "decode_callback_tokens_per_s": callback["decode"],
              "full_batch_decode_callback_tokens_per_s": callback["full"],
              "ttft_s": min(s[0] for s in stamps.values()) - start}
    if rested:
        full_end = rates["full_end"]
        after = [[t for t in s if t > rested[0]] for s in stamps.values()]
        begin = max(s[2] if len(s) > 2 else math.inf for s in after)  # every row's third token after it
        counted = sum(sum(1 for t in s if begin < t <= full_end) for s in after)
        result["rested_decode_tokens_per_s"] = counted / (full_end - begin) if full_end > begin else float("nan")
        result["rested_tokens"] = counted
    return result


def time_to_first_token(engine, prompt: list[int]) -> tuple[float, int]:
    """Seconds to the first token of one request, and the prompt tokens it reused from the cache."""
    seen: dict[str, float] = {}
    reused = []

    def record(event) -> None:
        if isinstance(event, TokenEvent):
            seen.setdefault("first", time.perf_counter())
        else:
            reused.append(event.num_reused_tokens)

    request_id = f"ttft-{time.perf_counter_ns()}"
    start = time.perf_counter()
    submit_greedy(engine, request_id, prompt, 1, record)
    engine.run_until_idle()
    return seen["first"] - start, reused[0]


def run_hf(model, workload: Workload, vocab: int, device: torch.device) -> dict:
    prompts = torch.tensor(workload.prompts(vocab), device=device)
    mask = torch.ones_like(prompts)
    with torch.inference_mode():
        model.generate(prompts[:1, :8], attention_mask=mask[:1, :8], max_new_tokens=2, do_sample=False, pad_token_id=0)
        _synchronize(device)
        start = time.perf_counter()
        out = model.generate(prompts, attention_mask=mask, max_new_tokens=workload.output,
                             min_new_tokens=workload.output, do_sample=False, pad_token_id=0)
        _synchronize(device)
    elapsed = time.perf_counter() - start
    tokens = (out.shape[1] - prompts.shape[1]) * prompts.shape[0]
    return {"tokens": tokens, "seconds": elapsed, "tokens_per_s": tokens / elapsed,
            "first_tokens": out[:, prompts.shape[1]:prompts.shape[1] + 16].tolist()}


def roofline(shape: LlamaShape, workload: Workload, bandwidth: float, element_bytes: int) -> float:
    """Output tokens/s if each decode step only read its bytes at `bandwidth` (read+write copy rate)."""
    mean_context = workload.prompt + workload.output / 2
    step_bytes = shape.parameters() * element_bytes + workload.requests * mean_context * shape.kv_bytes_per_token(element_bytes)
    read_bandwidth = bandwidth  # a copy's read+write bytes over its time: the achievable traffic rate
    return workload.requests / (step_bytes / read_bandwidth)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def prepare(shape: LlamaShape, workloads: list[Workload], scratch: Path, key: SigningKey, dtype: str,
            ttft_prompt: int, device: torch.device = torch.device("cpu"), on_checkpoint=None) -> Path:
    """Writes a random checkpoint (on `device`), calls `on_checkpoint()` (the device is free from
    here on: preparation runs on the host), and prepares the core for `workloads`."""
    started = time.perf_counter()
    checkpoint = write_random_llama(scratch / "checkpoint", shape, getattr(torch, dtype), progress=_every(8),
                                    device=device.type)
    log(f"checkpoint written in {time.perf_counter() - started:.0f} s")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    if on_checkpoint is not None:
        on_checkpoint()
    batches = tuple(sorted({w.requests for w in workloads} | {1}))
    context = max([w.prompt + w.output for w in workloads] + [ttft_prompt + 16])
    # Every workload's requests live at once; the TTFT prompts and cached prefixes need a few more.
    pages = max(w.requests * -(-(w.prompt + w.output) // 16) for w in workloads) + 4 * -(-context // 16)
    prefill = min(2048, context)
    chunks = prefill_chunks(prefill)
    plan = CapacityPlan(page_tokens=16, context_tokens=context, prefill_tokens=prefill, decode_batches=batches,
                        prefill_batches=(1,), mixed=True, page_capacity=max(pages, 2 * context // 16),
                        prefill_chunks=chunks)
    core = scratch / "model.core"
    started = time.perf_counter()
    prepare_core(checkpoint, core, key, PrepareOptions(NAMESPACE, dtype=dtype, capacities=plan), progress=log)
    log(f"prepared {core.stat().st_size / 1e9:.2f} GB in {time.perf_counter() - started:.0f} s")
    return core


def prefill_chunks(prefill: int) -> tuple[int, ...]:
    """The smaller prompt capacities captured beside `prefill` (128, 256 and 512 for 2,048): short
    prompts and the uncached rest of a cached prompt (208 tokens of a 2,048-token prompt with 90%
    cached) run the smallest program that holds them; 256 took that rest out of the 512 program."""
    return tuple(chunk for chunk in (prefill // 16, prefill // 8, prefill // 4) if 0 < chunk < prefill)


def _every(n: int):
    count = [0]

    def progress(line: str) -> None:
        count[0] += 1
        if count[0] % n == 0:
            log(line)
    return progress


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32, help="decoder layers of the 8B shape (default 32)")
    parser.add_argument("--workloads", default="1x128x128,64x128x128,256x128x128,64x1024x1024",
                        help="comma-separated REQUESTSxPROMPTxOUTPUT")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--hf-max-batch", type=int, default=64, help="largest workload run through transformers (0: none)")
    parser.add_argument("--hf-max-output", type=int, default=128, help="skip transformers above this output length")
    parser.add_argument("--ttft-prompt", type=int, default=2048, help="prompt tokens for the time-to-first-token rows")
    parser.add_argument("--no-graphs", action="store_true", help="run programs eagerly (no CUDA graphs)")
    parser.add_argument("--json", type=Path, help="write every number here")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (checks the script)")
    args = parser.parse_args()
    shape = SMOKE if args.smoke else with_layers(LLAMA_31_8B, args.layers)
    device = torch.device("cpu" if args.smoke else "cuda")
    workloads = [Workload(2, 16, 8), Workload(4, 32, 16)] if args.smoke else [Workload.parse(w) for w in args.workloads.split(",")]
    ttft_prompt = 64 if args.smoke else args.ttft_prompt
    element_bytes = torch.empty((), dtype=getattr(torch, args.dtype)).element_size()
    results: dict = {"shape": shape.__dict__, "dtype": args.dtype, "torch": torch.__version__, "workloads": {}}
    log(f"torch {torch.__version__}, device {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, "
        f"{shape.parameters() / 1e9:.2f}B parameters, {args.dtype}")
    bandwidth = copy_bandwidth(device)
    results["copy_bandwidth_gbs"] = bandwidth / 1e9
    log(f"device copy bandwidth {bandwidth / 1e9:.0f} GB/s (read + write)")
    key = SigningKey.generate()
    with tempfile.TemporaryDirectory() as scratch:
        core = prepare(shape, workloads, Path(scratch), key, args.dtype, ttft_prompt, device)
        helios_rows(core, key, shape, workloads, results, args, device, bandwidth, element_bytes, ttft_prompt)
        if args.hf_max_batch > 0:
            hf_rows(shape, workloads, results, args, device, Path(scratch) / "checkpoint")
    print_table(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def helios_rows(core: Path, key: SigningKey, shape: LlamaShape, workloads, results: dict, args,
                device: torch.device, bandwidth: float, element_bytes: int, ttft_prompt: int) -> None:
    started = time.perf_counter()
    options = RuntimeOptions(load=LoadOptions(device=str(device), cuda_graphs=not args.no_graphs),
                             queue_capacity=max(w.requests for w in workloads) + 8)
    runtime = build_runtime(open_core(core, accept=NAMESPACE, trusted_keys=[key.public]), options)
    results["load_seconds"] = time.perf_counter() - started
    log(f"loaded in {results['load_seconds']:.0f} s")
    run_helios(runtime.engine, Workload(2, 16, 4), shape.vocab_size, salt=99)  # warm-up
    for workload in workloads:
        behind = runtime.engine.stats.second_frames
        ours = run_helios(runtime.engine, workload, shape.vocab_size)
        ours["second_frames"] = runtime.engine.stats.second_frames - behind
        ours["roofline_tokens_per_s"] = roofline(shape, workload, bandwidth, element_bytes)
        results["workloads"][str(workload)] = {"helios": ours}
        log(f"helios {workload}: {ours['tokens_per_s']:.1f} tok/s (decode {ours['decode_tokens_per_s']:.1f}, "
            f"{ours['second_frames']} rounds submitted behind another)")
    results["one_frame"] = one_frame_rows(runtime.engine, workloads[:2], shape.vocab_size, results)
    results["ttft"] = ttft_rows(runtime.engine, shape.vocab_size, ttft_prompt)
    runtime.close()
    del runtime
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def one_frame_rows(engine, workloads, vocab: int, results: dict) -> dict:
    """The same workloads with one execution frame (no overlap of host packing and the device):
    decode tok/s with two frames over one frame, measured in this process."""
    frames, engine.frames = engine.frames, 1
    rows = {}
    try:
        for workload in workloads:
            single = run_helios(engine, workload, vocab, salt=7)
            double = results["workloads"][str(workload)]["helios"]
            rows[str(workload)] = {"one_frame": single,
                                   "speedup": double["decode_tokens_per_s"] / single["decode_tokens_per_s"]}
            log(f"one frame {workload}: decode {single['decode_tokens_per_s']:.1f} tok/s; "
                f"two frames / one frame {rows[str(workload)]['speedup']:.3f}x")
    finally:
        engine.frames = frames
    return rows


def ttft_rows(engine, vocab: int, prompt_tokens: int, samples: int = 5) -> dict:
    """Time to the first token of a cold prompt and of one whose first 90% is cached, `samples` of
    each (every cold prompt distinct, every cached one a distinct tail on the first cold prompt):
    the medians, and every sample."""
    def tokens(seed: int, count: int) -> list[int]:
        return [(i * 131 + 7 + seed * 7919) % (vocab - 16) + 16 for i in range(count)]

    shared = int(prompt_tokens * 0.9)
    colds = [time_to_first_token(engine, tokens(seed, prompt_tokens))[0] for seed in range(samples)]
    base = tokens(0, prompt_tokens)[:shared]
    warms, reused = [], []
    for seed in range(samples):
        tail = [(i * 17 + 3 + seed * 104729) % (vocab - 16) + 16 for i in range(prompt_tokens - shared)]
        seconds, count = time_to_first_token(engine, base + tail)
        warms.append(seconds)
        reused.append(count)
    cold_s, warm_s = statistics.median(colds), statistics.median(warms)
    log(f"TTFT {prompt_tokens} tokens, median of {samples}: {cold_s * 1e3:.1f} ms cold "
        f"({', '.join(f'{s * 1e3:.1f}' for s in colds)}), {warm_s * 1e3:.1f} ms with {min(reused)} cached "
        f"({', '.join(f'{s * 1e3:.1f}' for s in warms)})")
    return {"prompt_tokens": prompt_tokens, "cold_s": cold_s, "prefix_cached_s": warm_s, "reused_tokens": min(reused),
            "cold_samples_s": colds, "prefix_cached_samples_s": warms}


def hf_rows(shape: LlamaShape, workloads, results: dict, args, device: torch.device, checkpoint: Path) -> None:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(checkpoint), dtype=getattr(torch, args.dtype), attn_implementation="sdpa").to(device).eval()
    for workload in workloads:
        if workload.requests > args.hf_max_batch or workload.output > args.hf_max_output:
            continue
        theirs = run_hf(model, workload, shape.vocab_size, device)
        results["workloads"][str(workload)]["transformers"] = theirs
        log(f"transformers {workload}: {theirs['tokens_per_s']:.1f} tok/s")


def print_table(results: dict) -> None:
    log("")
    log("| workload (requests x prompt/output) | Helios tok/s | Helios decode tok/s | transformers tok/s | roofline tok/s | Helios/transformers | Helios decode/roofline |")
    log("|---|---|---|---|---|---|---|")
    for name, row in results["workloads"].items():
        ours, theirs = row["helios"], row.get("transformers")
        peer = f"{theirs['tokens_per_s']:.1f}" if theirs else "not run"
        ratio = f"{ours['tokens_per_s'] / theirs['tokens_per_s']:.1f}x" if theirs else "-"
        log(f"| {name} | {ours['tokens_per_s']:.1f} | {ours['decode_tokens_per_s']:.1f} | {peer} | "
            f"{ours['roofline_tokens_per_s']:.1f} | {ratio} | {ours['decode_tokens_per_s'] / ours['roofline_tokens_per_s']:.0%} |")
    for name, row in results.get("one_frame", {}).items():
        log(f"| {name}, one execution frame (no overlap) | | {row['one_frame']['decode_tokens_per_s']:.1f} | | | | "
            f"two frames / one: {row['speedup']:.2f}x |")
    ttft = results["ttft"]
    log(f"| TTFT, {ttft['prompt_tokens']}-token prompt | {ttft['cold_s'] * 1e3:.1f} ms | | | | | |")
    log(f"| TTFT, 90% from the prefix cache ({ttft['reused_tokens']} reused) | {ttft['prefix_cached_s'] * 1e3:.1f} ms | | | | | |")


if __name__ == "__main__":
    main()
