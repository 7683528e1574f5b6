"""The batch-1 greedy decode step as main captures it against this tree's capture-time rewrites, in
one process on one core: an 8B-shaped core of ``--layers`` layers (default 32) is prepared with the
DECODE batches of ``--batches`` (default 1), loaded without CUDA graphs (so every variant below starts
from the same exported module), served for as many greedy requests as the largest batch (``--prompt`` +
``--output`` tokens: the programs' buffers then hold the last decode step), and the greedy DECODE graph
of the first batch is captured these ways (of the other batches, the first four):

- ``main``: as main captures it (rotary pairs unfused, bookkeeping as exported);
- ``steps``: with `helios.runtime.loading.step_calls.step_module` (bookkeeping collapsed);
- ``rotary``: with each layer's rotary cache write and attention fused (`rotary_calls`);
- ``both``: both rewrites;
- ``both+runs``: both rewrites and each run of consecutive small integer elementwise calls as one
  generated kernel (`helios.runtime.loading.elementwise_runs`, off when serving until measured);
- ``both+cublaslt``, ``both+fp32-reduce``: both rewrites, the graph captured (and profiled) with torch's
  matmuls on cuBLASLt (``preferred_blas_library``), or with bf16 reduced-precision split-K reductions
  disallowed: whether cuBLAS then picks one-row kernels without the split-K reduction launches (the
  o and down projections' ``splitKreduce_kernel``, 64 a step at 32 layers); their logits may differ
  from main's by the matmuls' rounding;
- ``both+nn``: both rewrites, each layer's one-row projection ``linear(x, W)`` computed as ``mm(x, W.T)``
  on a transposed copy of W made here (cuBLAS then sees a row-major [in, out] operand and picks its
  kernels for that layout): whether a prepare-time weight layout would read the weights faster.

For each: device ms per replay (CUDA events, alternated rounds, median), whether its sampled token
and completion record equal main's and how far its logits are (same buffers restored before each
run), and the torch profiler's kernels of one eager run of the same graph (count, ms by kind).

    python bench/step_launches_ab.py [--layers 32] [--batches 1,64] [--json out.json]
    python bench/step_launches_ab.py --smoke     # tiny shapes on the CPU (checks the script runs)
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import re
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils import _pytree as pytree

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lever_ab  # noqa: E402
from gpu_serving import NAMESPACE, Workload, log, submit_greedy  # noqa: E402
from random_llama import LLAMA_31_8B, SMOKE, with_layers, write_random_llama  # noqa: E402

from helios.core.keys import SigningKey  # noqa: E402
from helios.core.reader import open_core  # noqa: E402
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core  # noqa: E402
import helios.runtime.loading.programs as program_loading  # noqa: E402
from helios.runtime.loading.cuda_graphs import greedy_module  # noqa: E402
from helios.runtime.loading.elementwise_runs import runs_module  # noqa: E402
from helios.runtime.loading.gemv_calls import gemv_module  # noqa: E402
from helios.runtime.loading.model import LoadOptions, program_arguments  # noqa: E402
from helios.runtime.loading.rotary_calls import rotary_module  # noqa: E402
from helios.runtime.loading.step_calls import step_module  # noqa: E402
from helios.runtime.service import RuntimeOptions, build_runtime  # noqa: E402

VARIANTS = ("main", "steps", "rotary", "both", "both+runs", "both+cublaslt", "both+fp32-reduce", "both+nn")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--batches", default="1", help="DECODE batches measured (the first with every variant)")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--output", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5, help="alternated timing rounds per variant")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--smoke", action="store_true")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device("cpu" if args.smoke else "cuda")
    if not args.smoke and not torch.cuda.is_available():
        print("needs a CUDA device (or --smoke)", file=sys.stderr)
        return 2
    shape = SMOKE if args.smoke else with_layers(LLAMA_31_8B, args.layers)
    prompt, output = (16, 4) if args.smoke else (args.prompt, args.output)
    batches = [int(b) for b in args.batches.split(",")]
    if args.smoke:  # the exported graphs a CUDA model captures, not the CPU path's rewrites
        program_loading.cpu_program = lambda module: module
    key = SigningKey.generate()
    with tempfile.TemporaryDirectory() as scratch:
        core = prepare(shape, Path(scratch), key, (prompt, output), device, tuple(batches))
        options = RuntimeOptions(load=LoadOptions(device=str(device), cuda_graphs=False), queue_capacity=4)
        started = time.perf_counter()
        runtime = build_runtime(open_core(core, accept=NAMESPACE, trusted_keys=[key.public]), options)
        log(f"loaded (no graphs) in {time.perf_counter() - started:.1f} s")
        try:
            serve(runtime.engine, max(batches), prompt, output, shape.vocab_size)
            results = {"layers": shape.num_hidden_layers, "batches": {}}
            for rows in batches:  # the first batch: every variant, profiled; the others: the rewrites, timed
                first = rows == batches[0]
                names = VARIANTS if first else ("main", "steps", "both", "both+runs")
                results["batches"][rows] = compare(runtime.model, device, args.rounds, rows, names, first)
                summarize(results["batches"][rows], shape.num_hidden_layers, rows)
        finally:
            runtime.close()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 0


def prepare(shape, scratch: Path, key, lengths: tuple[int, int], device: torch.device, batches: tuple) -> Path:
    started = time.perf_counter()
    checkpoint = write_random_llama(scratch / "checkpoint", shape, torch.bfloat16, device=device.type)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    plan = CapacityPlan(page_tokens=16, context_tokens=sum(lengths) + 16, prefill_tokens=lengths[0],
                        decode_batches=tuple(sorted(set(batches))),
                        mixed=False, token_logprobs=False)
    core = scratch / "model.core"
    prepare_core(checkpoint, core, key, PrepareOptions(NAMESPACE, dtype="bfloat16", capacities=plan))
    log(f"checkpoint and core ({shape.num_hidden_layers} layers) in {time.perf_counter() - started:.1f} s")
    return core


def serve(engine, requests: int, prompt: int, output: int, vocab: int) -> None:
    """Greedy requests, eagerly: the DECODE programs' buffers then hold the last step (the rows of a
    smaller program are the first rows of it: live requests with their contexts)."""
    started = time.perf_counter()
    for index, tokens in enumerate(Workload(requests, prompt, output).prompts(vocab, 5)):
        submit_greedy(engine, f"ab{index}", tokens, output, lambda event: None)
    engine.run_until_idle()
    log(f"served {requests} x {prompt}/{output} eagerly in {time.perf_counter() - started:.1f} s")


def variants(module, device: torch.device, weights: list, names: tuple = VARIANTS) -> dict:
    """The four greedy graphs of the module docstring."""
    unfused = gemv_module(rotary_module(module, enabled=False))
    fused = gemv_module(rotary_module(module, enabled=True))
    both = step_module(greedy_module(fused), device, enabled=True)
    return {"main": greedy_module(unfused), "steps": step_module(greedy_module(unfused), device, enabled=True),
            "rotary": greedy_module(fused), "both": both, "both+runs": runs_module(both, enabled=True),
            "both+cublaslt": both, "both+fp32-reduce": both,
            "both+nn": transposed_projections(both, weights) if "both+nn" in names else both}


def transposed_projections(module, weights: list):
    """`module` with every one-row ``linear(x, weights[i])`` of a layer (out features below the
    vocabulary's) as ``mm(x, transposed copy)`` (a new graph; the copies are its buffers)."""
    graph = copy.deepcopy(module.graph)
    rewritten = torch.fx.GraphModule(module, graph)
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.linear.default or len(node.args) != 2:
            continue
        x, weight = node.args
        index = re.fullmatch(r"weights_(\d+)", getattr(weight, "name", ""))
        value = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
        if index is None or not isinstance(value, torch.Tensor) or value.dim() != 2 or value.shape[0] != 1:
            continue
        tensor = weights[int(index.group(1))]
        if tensor.shape[0] > 65536:  # the head: its copy would cost 1 GB for one call a step
            continue
        rewritten.register_buffer(f"_transposed_{count}", tensor.t().contiguous(), persistent=False)
        with graph.inserting_before(node):
            product = graph.call_function(torch.ops.aten.mm.default, (x, graph.get_attr(f"_transposed_{count}")))
        product.meta = dict(node.meta)
        node.replace_all_uses_with(product)
        graph.erase_node(node)
        count += 1
    rewritten.recompile()
    log(f"both+nn: {count} one-row projections on transposed copies")
    return rewritten


@contextlib.contextmanager
def matmul_setting(variant: str):
    """torch's matmul settings for `variant` while the block runs (restored after)."""
    if not torch.cuda.is_available() or "+" not in variant:
        yield
        return
    library = torch.backends.cuda.preferred_blas_library()
    reduced = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    try:
        if variant.endswith("cublaslt"):
            torch.backends.cuda.preferred_blas_library("cublaslt")
        else:
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(library)
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = reduced


def compare(model, device: torch.device, rounds: int, rows: int, names: tuple, profiled: bool = True) -> dict:
    program = next(p for p in lever_ab.decode_programs(model) if p.batch_capacity == rows)
    arguments = program_arguments(program, model.weights, model.buffers)
    modules = {name: module for name, module in variants(program.module, device, arguments[0], names).items()}
    # what a step writes and later steps read (counts, pending tokens); not the cache planes, which the
    # load sized to the free memory: a step writes its own slots before it reads them
    state = {name: t.clone() for name, t in model.buffers.items()
             if isinstance(t, torch.Tensor) and t.numel() * t.element_size() < 2 ** 30}

    def restore() -> None:
        for name, tensor in state.items():
            model.buffers[name].copy_(tensor)

    outputs, entries = {}, {}
    for name in names:  # a variant that fails is reported and left out; the others stand
        try:
            restore()
            with matmul_setting(name):
                leaves = pytree.tree_leaves(modules[name](*arguments))
            outputs[name] = [t.clone() for t in leaves if isinstance(t, torch.Tensor)]
            restore()
            entries[name] = describe(name, modules[name], arguments, device, outputs, profiled)
        except Exception as error:  # noqa: BLE001
            log(f"{name}: failed: {type(error).__name__}: {str(error)[:300]}")
        restore()
    times = time_variants(modules, arguments, [name for name in names if name in entries], rounds, restore)
    for name, measured in times.items():
        ordered = sorted(measured)
        entries[name]["ms"] = ordered[len(ordered) // 2]
        entries[name]["ms_all"] = ordered
    return {"variants": {name: entries[name] for name in names if name in entries and "ms" in entries[name]}}


def describe(name: str, module, arguments, device: torch.device, outputs: dict, profiled: bool) -> dict:
    """Graph calls, outputs against main's, and (`profiled`) the eager profile of one variant."""
    entry = {"calls": sum(1 for n in module.graph.nodes if n.op == "call_function"),
             "outputs": agreement(outputs["main"], outputs[name]) if "main" in outputs else "main failed",
             "kernels": 0, "kernel_ms": 0.0, "by_kind_ms": {}, "top": []}
    if profiled:
        with matmul_setting(name):
            entry.update(profile(module, arguments, device))
    log(f"{name}: {entry['calls']} graph calls, {entry['kernels']} kernels ({entry['kernel_ms']:.3f} ms) in an eager "
        f"run; {entry['outputs']}")
    return entry


def time_variants(modules: dict, arguments, names: list, rounds: int, restore) -> dict:
    """Device ms per replay of each variant's captured graph, `rounds` alternated rounds."""
    times = {name: [] for name in names}
    for round_index in range(rounds):  # alternated: drift hits every variant alike
        for name in list(times):
            try:
                with matmul_setting(name):  # the capture records the kernels the setting picks
                    times[name].append(lever_ab.graph_ms(lambda module=modules[name]: module(*arguments), replays=30))
            except Exception as error:  # noqa: BLE001
                log(f"{name}: capture failed: {type(error).__name__}: {str(error)[:300]}")
                del times[name]
            restore()
        log(f"round {round_index + 1}: " + ", ".join(f"{name} {ms[-1]:.3f}" for name, ms in times.items()) + " ms")
    return times


def agreement(ours: list, theirs: list) -> str:
    exact = [torch.equal(a, b) for a, b in zip(ours, theirs) if not a.is_floating_point()]
    spread = max((float((a.float() - b.float()).abs().max()) for a, b in zip(ours, theirs)
                  if a.is_floating_point() and a.numel()), default=0.0)
    return f"{sum(exact)}/{len(exact)} integer outputs equal, logits within {spread:.3g}"


def profile(module, arguments, device: torch.device) -> dict:
    """Kernels of one eager run of `module` (CPU: its top-level ops)."""
    on_cuda = device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if on_cuda else [])
    module(*arguments)
    if on_cuda:
        torch.cuda.synchronize()
    with torch.profiler.profile(activities=activities) as traced:
        module(*arguments)
        if on_cuda:
            torch.cuda.synchronize()
    kernels = lever_ab._kernels(traced, on_cuda)
    return {"kernels": len(kernels), "kernel_ms": sum(lever_ab._self_us(e, on_cuda) for e in kernels) / 1e3,
            "by_kind_ms": lever_ab._categories(kernels, on_cuda), "top": lever_ab._top_kernels(kernels, 12)}


def summarize(results: dict, layers: int, rows: int) -> None:
    if "main" not in results["variants"]:
        log(f"SUMMARY R={rows}: main's graph was not measured; no ratios")
        return
    base = results["variants"]["main"]["ms"]
    log(f"| {layers}-layer greedy DECODE step, batch {rows} | replay ms | vs main | kernels | kernel ms "
        f"| other ms | outputs against main |")
    log("|---|---|---|---|---|---|---|")
    for name, entry in results["variants"].items():
        log(f"| {name} | {entry['ms']:.3f} | {base / entry['ms']:.3f}x | {entry['kernels']} | {entry['kernel_ms']:.3f} "
            f"| {entry['by_kind_ms'].get('other', 0.0):.3f} | {entry['outputs']} |")
    for name, entry in results["variants"].items():
        log(f"SUMMARY R={rows} {name}: {entry['ms']:.3f} ms per replay ({base / entry['ms']:.3f}x main), {entry['kernels']} "
            f"kernels, by kind " + ", ".join(f"{k} {v:.3f}" for k, v in entry["by_kind_ms"].items()))
        if name in ("main", "both", "both+cublaslt", "both+nn") and rows == 1:
            for top in entry["top"]:
                log(f"    {top['ms']:7.3f} ms  x{top['calls']:<4d} {top['kernel'][:80]}")


if __name__ == "__main__":
    sys.exit(main())
