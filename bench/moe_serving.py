"""Mixture-of-experts serving benchmark on one GPU: Helios against `transformers` and the roofline of
the bytes a decode step actually reads.

Builds a random Qwen3-30B-A3B-shaped checkpoint in bf16 with fewer layers (`bench/random_moe.py`,
``--layers``, default 8: 128 experts of width 768, top-8, 32 query / 4 key-value heads), prepares it
into a core with decode programs for batches 1, 64 and 256, loads it with CUDA graphs and runs, in
this one process:

- decode workloads of N concurrent greedy requests (P prompt, O output tokens, EOS ignored):
  Helios output tok/s and steady decode tok/s (`bench/gpu_serving.py`'s measurement);
- the same workloads through `transformers` `generate` on the same weights (bf16, SDPA), with a
  hook on every router that records how many distinct experts each decode step selects per layer;
- the roofline: per decode step, the attention, norm and router weights of every layer, the head,
  the rows of the embedding, the weights of the distinct experts selected per layer (measured
  through transformers' routers where it ran the workload, else the uniform-routing expectation
  E * (1 - (1 - k / E) ** N)), and the KV of every live token at the mean context, read at the
  device-to-device copy bandwidth measured here.

Prints one table; ``--json PATH`` writes every number; ``--smoke`` checks the script on the CPU.

    python bench/moe_serving.py [--layers 8] [--workloads 1x128x128,64x128x128,256x128x128] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from gpu_serving import Workload, _every, copy_bandwidth, log, run_helios, run_hf  # noqa: E402
from random_moe import QWEN3_30B_A3B, SMOKE, MoeShape, with_layers, write_random_qwen3_moe  # noqa: E402

from helios.core.keys import SigningKey  # noqa: E402
from helios.core.reader import open_core  # noqa: E402
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core  # noqa: E402
from helios.runtime.loading.model import LoadOptions  # noqa: E402
from helios.runtime.service import RuntimeOptions, build_runtime  # noqa: E402

NAMESPACE = "bench/moe"


def uniform_distinct_experts(shape: MoeShape, tokens: int) -> float:
    """Expected distinct experts per layer when `tokens` tokens each pick k of E uniformly."""
    experts, k = shape.num_experts, shape.num_experts_per_tok
    return experts * (1 - (1 - k / experts) ** tokens)


def step_bytes(shape: MoeShape, workload: Workload, distinct_experts: float, element_bytes: int) -> float:
    """The bytes one decode step of `workload.requests` rows must read (see the module docstring)."""
    rows = workload.requests
    dense = shape.num_hidden_layers * shape.attention_parameters() + shape.vocab_size * shape.hidden_size
    dense += rows * shape.hidden_size + shape.hidden_size  # embedding rows, final norm
    experts = shape.num_hidden_layers * distinct_experts * shape.expert_parameters()
    mean_context = workload.prompt + workload.output / 2
    kv = rows * mean_context * shape.kv_bytes_per_token(element_bytes)
    return (dense + experts) * element_bytes + kv


def prepare(shape: MoeShape, workloads: list[Workload], scratch: Path, key: SigningKey, dtype: str,
            device: torch.device) -> Path:
    started = time.perf_counter()
    checkpoint = write_random_qwen3_moe(scratch / "checkpoint", shape, getattr(torch, dtype), progress=_every(4),
                                        device=device.type)
    log(f"checkpoint written in {time.perf_counter() - started:.0f} s")
    batches = tuple(sorted({w.requests for w in workloads} | {1}))
    prefill = min(2048, max(w.requests * w.prompt for w in workloads))  # a prefill step packs many prompts
    context = max([w.prompt + w.output for w in workloads] + [prefill])
    pages = max(w.requests * -(-(w.prompt + w.output) // 16) for w in workloads) + 4 * -(-context // 16)
    plan = CapacityPlan(page_tokens=16, context_tokens=context, prefill_tokens=prefill, decode_batches=batches,
                        prefill_batches=(1,), mixed=True, page_capacity=pages,
                        prefill_chunks=tuple(c for c in (128, 512) if c < prefill))
    core = scratch / "model.core"
    started = time.perf_counter()
    prepare_core(checkpoint, core, key, PrepareOptions(NAMESPACE, dtype=dtype, capacities=plan), progress=log)
    log(f"prepared {core.stat().st_size / 1e9:.2f} GB in {time.perf_counter() - started:.0f} s")
    return core


def helios_rows(core: Path, key: SigningKey, shape: MoeShape, workloads, results: dict, args, device) -> None:
    started = time.perf_counter()
    options = RuntimeOptions(load=LoadOptions(device=str(device), cuda_graphs=not args.no_graphs),
                             queue_capacity=max(w.requests for w in workloads) + 8)
    runtime = build_runtime(open_core(core, accept=NAMESPACE, trusted_keys=[key.public]), options)
    results["load_seconds"] = time.perf_counter() - started
    log(f"loaded in {results['load_seconds']:.0f} s")
    run_helios(runtime.engine, Workload(2, 16, 4), shape.vocab_size, salt=99)  # warm-up
    for workload in workloads:
        ours = run_helios(runtime.engine, workload, shape.vocab_size)
        results["workloads"][str(workload)] = {"helios": ours}
        log(f"helios {workload}: {ours['tokens_per_s']:.1f} tok/s (decode {ours['decode_tokens_per_s']:.1f})")
    runtime.close()
    del runtime
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def hf_rows(shape: MoeShape, workloads, results: dict, args, device, checkpoint: Path) -> None:
    """transformers on the same weights; its routers report the distinct experts of each decode step."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(checkpoint), dtype=getattr(torch, args.dtype), attn_implementation="sdpa").to(device).eval()
    distinct: list[tuple[int, int]] = []  # (tokens routed, distinct experts) per router call

    def record(module, inputs, output) -> None:
        ids = output[2]
        distinct.append((ids.shape[0], torch.unique(ids).numel()))

    hooks = [layer.mlp.gate.register_forward_hook(record) for layer in model.model.layers]
    for workload in workloads:
        if workload.requests > args.hf_max_batch:
            continue
        distinct.clear()
        theirs = run_hf(model, workload, shape.vocab_size, device)
        steps = [count for tokens, count in distinct if tokens == workload.requests]
        theirs["distinct_experts_per_layer"] = sum(steps) / len(steps) if steps else float("nan")
        results["workloads"][str(workload)]["transformers"] = theirs
        log(f"transformers {workload}: {theirs['tokens_per_s']:.1f} tok/s; "
            f"{theirs['distinct_experts_per_layer']:.1f} distinct experts per layer and decode step")
    for hook in hooks:
        hook.remove()
    del model
    gc.collect()


def roofline_rows(shape: MoeShape, workloads, results: dict, bandwidth: float, element_bytes: int) -> None:
    for workload in workloads:
        row = results["workloads"][str(workload)]
        measured = row.get("transformers", {}).get("distinct_experts_per_layer")
        experts = measured if measured == measured and measured is not None else uniform_distinct_experts(shape, workload.requests)
        row["distinct_experts_per_layer"] = experts
        row["distinct_experts_source"] = "measured" if measured is not None and measured == measured else "uniform"
        row["step_bytes"] = step_bytes(shape, workload, experts, element_bytes)
        row["roofline_tokens_per_s"] = workload.requests * bandwidth / row["step_bytes"]


def print_table(results: dict) -> None:
    log("")
    log("| workload (requests x prompt/output) | Helios tok/s | Helios decode tok/s | transformers tok/s | "
        "experts read per layer | bytes per step | roofline tok/s | Helios/transformers | Helios decode/roofline |")
    log("|---|---|---|---|---|---|---|---|---|")
    for name, row in results["workloads"].items():
        ours, theirs = row["helios"], row.get("transformers")
        peer = f"{theirs['tokens_per_s']:.1f}" if theirs else "not run"
        ratio = f"{ours['tokens_per_s'] / theirs['tokens_per_s']:.1f}x" if theirs else "-"
        log(f"| {name} | {ours['tokens_per_s']:.1f} | {ours['decode_tokens_per_s']:.1f} | {peer} | "
            f"{row['distinct_experts_per_layer']:.1f} ({row['distinct_experts_source']}) | {row['step_bytes'] / 1e9:.2f} GB | "
            f"{row['roofline_tokens_per_s']:.1f} | {ratio} | {ours['decode_tokens_per_s'] / row['roofline_tokens_per_s']:.0%} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8, help="decoder layers of the Qwen3-30B-A3B shape (default 8)")
    parser.add_argument("--workloads", default="1x128x128,64x128x128,256x128x128",
                        help="comma-separated REQUESTSxPROMPTxOUTPUT")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--hf-max-batch", type=int, default=256, help="largest workload run through transformers (0: none)")
    parser.add_argument("--no-graphs", action="store_true", help="run programs eagerly (no CUDA graphs)")
    parser.add_argument("--json", type=Path, help="write every number here")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (checks the script)")
    args = parser.parse_args()
    shape = SMOKE if args.smoke else with_layers(QWEN3_30B_A3B, args.layers)
    device = torch.device("cpu" if args.smoke else "cuda")
    workloads = [Workload(1, 16, 8), Workload(4, 16, 8)] if args.smoke else [Workload.parse(w) for w in args.workloads.split(",")]
    element_bytes = torch.empty((), dtype=getattr(torch, args.dtype)).element_size()
    results: dict = {"shape": shape.__dict__, "dtype": args.dtype, "torch": torch.__version__, "workloads": {}}
    log(f"torch {torch.__version__}, device {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, "
        f"{shape.parameters() / 1e9:.2f}B parameters, {args.dtype}")
    bandwidth = copy_bandwidth(device)
    results["copy_bandwidth_gbs"] = bandwidth / 1e9
    log(f"device copy bandwidth {bandwidth / 1e9:.0f} GB/s (read + write)")
    key = SigningKey.generate()
    with tempfile.TemporaryDirectory() as scratch:
        core = prepare(shape, workloads, Path(scratch), key, args.dtype, device)
        helios_rows(core, key, shape, workloads, results, args, device)
        if args.hf_max_batch > 0:
            hf_rows(shape, workloads, results, args, device, Path(scratch) / "checkpoint")
    roofline_rows(shape, workloads, results, bandwidth, element_bytes)
    print_table(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
