"""A short per-step decode profile at the compiled anchor's shapes: an 8B-shaped core of ``--layers``
layers (default 4: per-layer kernels as at 32 layers, in a fraction of the prepare time), each batch
of ``--batches`` served with 128-token prompts and greedy output (CUDA graphs), then the torch
profiler's kernels of one eager decode step at each batch (the program's buffers hold that batch's
last step, contexts about prompt + output), by kind, per layer, and the top kernels.

    python bench/decode_step_profile.py [--layers 4] [--batches 1,256] [--output 32] [--json out.json]
    python bench/decode_step_profile.py --smoke   # tiny shapes on the CPU (checks the script runs)

What to read: the per-layer attention ms (the decode kernel's share), whether a fill kernel
(``FillFunctor``) is still launched per layer, the graph replay ms against the kernel sum (the
launch gaps a captured step still has), and (CUDA) the greedy step captured as served against the
same step with every projection on cuBLAS (the GEMV table's gain in place).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils import _pytree as pytree

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lever_ab  # noqa: E402
from gpu_serving import NAMESPACE, Workload, log, prepare, run_helios, submit_greedy  # noqa: E402
from random_llama import LLAMA_31_8B, SMOKE, with_layers  # noqa: E402

from helios.abi.sampling import SampleVariant  # noqa: E402
from helios.core.keys import SigningKey  # noqa: E402
from helios.core.reader import open_core  # noqa: E402
from helios.runtime.loading.cuda_graphs import variant_module  # noqa: E402
from helios.runtime.loading.model import LoadOptions, program_arguments  # noqa: E402
from helios.runtime.records.events import TokenEvent  # noqa: E402
from helios.runtime.service import RuntimeOptions, build_runtime  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batches", default="1,256")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--output", type=int, default=32)
    parser.add_argument("--top", type=int, default=14, help="kernels listed per profiled step")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--gemv-tiles", default="",
                        help="OUTxIN=TILE,... one-row projections bound to the Triton GEMV for this run (added to "
                             "GEMV_TILES before capture; the step A/B then times them against cuBLAS)")
    parser.add_argument("--smoke", action="store_true")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device("cpu" if args.smoke else "cuda")
    if not args.smoke and not torch.cuda.is_available():
        print("needs a CUDA device (or --smoke)", file=sys.stderr)
        return 2
    shape = SMOKE if args.smoke else with_layers(LLAMA_31_8B, args.layers)
    batches = [1, 2] if args.smoke else [int(b) for b in args.batches.split(",")]
    prompt, output = (16, 8) if args.smoke else (args.prompt, args.output)
    workloads = [Workload(b, prompt, output) for b in batches]
    add_gemv_tiles(args.gemv_tiles)
    key = SigningKey.generate()
    results: dict = {"layers": shape.num_hidden_layers, "workloads": {}, "profiles": []}
    with tempfile.TemporaryDirectory() as scratch:
        core = prepare(shape, workloads, Path(scratch), key, "bfloat16", prompt, device)
        options = RuntimeOptions(load=LoadOptions(device=str(device), cuda_graphs=device.type == "cuda"),
                                 queue_capacity=max(batches) + 8)
        runtime = build_runtime(open_core(core, accept=NAMESPACE, trusted_keys=[key.public]), options)
        try:
            run_helios(runtime.engine, Workload(2, 16, 4), shape.vocab_size, salt=99)  # warm-up
            for workload in workloads:  # each batch's program keeps its last decode step in its buffers
                ours = served_steps(runtime.engine, workload, shape.vocab_size)
                results["workloads"][str(workload)] = ours
                log(f"helios {workload} ({shape.num_hidden_layers} layers): {ours['ms_per_step']:.3f} ms per decode "
                    f"step, {ours['rows_per_step']:.1f} rows a step, once every prompt is in")
            host_profile(runtime.engine, workloads[-1], shape.vocab_size, args.top)
            for rows in batches:
                profile = lever_ab.decode_profile(runtime.model, rows, args.top, log)
                results["profiles"].append(profile)
                served = results["workloads"][str(Workload(rows, prompt, output))]
                summarize(profile, shape.num_hidden_layers, served["ms_per_step"])
                for name, ab in (("rotary_step_ab", rotary_step_ab), ("gemv_step_ab", gemv_step_ab)):
                    if device.type != "cuda" and name == "gemv_step_ab":
                        continue
                    try:
                        results.setdefault(name, []).append(ab(runtime.model, rows))
                    except Exception as error:  # noqa: BLE001  (reported; the profile lines stand)
                        log(f"SUMMARY {name} R={rows}: failed: {type(error).__name__}: {str(error)[:200]}")
        finally:
            runtime.close()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 0


def add_gemv_tiles(spec: str) -> None:
    """``OUTxIN=BNxBKxW,...``: GEMV_TILES entries for this process (read when programs are captured)."""
    from helios.abi.gemv_tiles import GEMV_TILES, GemvTile

    for entry in filter(None, (part.strip() for part in spec.split(","))):
        shape, tile = entry.split("=")
        out_features, in_features = (int(v) for v in shape.lower().split("x"))
        GEMV_TILES[(out_features, in_features)] = GemvTile.parse(tile)
        log(f"GEMV tile for this run: {out_features}x{in_features} -> {tile}")


def served_steps(engine, workload: Workload, vocab: int) -> dict:
    """Wall ms per engine step once the last request has its first token (every prompt prefilled),
    and the mean rows decoded a step there (requests prefilled first may finish earlier)."""
    stamps: dict[str, list[float]] = {}

    def record(event) -> None:
        if isinstance(event, TokenEvent):
            stamps[event.request_id].extend([time.perf_counter()] * len(event.token_ids))

    for index, prompt in enumerate(workload.prompts(vocab, 7)):
        stamps[f"p{index}"] = []
        submit_greedy(engine, f"p{index}", prompt, workload.output, record)
    engine.run_until_idle()
    first = max(s[0] for s in stamps.values())
    last = max(s[-1] for s in stamps.values())
    after = [sum(1 for t in s if t > first) for s in stamps.values()]
    steps = max(max(after), 1)
    return {"ms_per_step": 1e3 * (last - first) / steps, "rows_per_step": sum(after) / steps, "steps": steps}


def host_profile(engine, workload: Workload, vocab: int, top: int) -> None:
    """The host's functions by own time (cProfile) while `workload` is served again: where an engine
    step's host work goes at that batch (the device wait included where the host blocks)."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    served = served_steps(engine, workload, vocab)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    log(f"host profile of {workload} ({served['ms_per_step']:.3f} ms per step once every prompt is in):")
    log(text.getvalue())


def gemv_step_ab(model, rows: int) -> dict:
    """The greedy decode step at `rows` as captured (its tabled one-row projections on the Triton
    GEMV) against the same graph with every projection on cuBLAS: device ms per replay of each."""
    from helios.abi.triton_gemv import gemv_linear

    program = next((p for p in lever_ab.decode_programs(model) if p.batch_capacity == rows), None)
    if program is None:
        return {}
    arguments = program_arguments(program, model.weights, model.buffers)
    bound = variant_module(lever_ab._eager(program), SampleVariant.GREEDY)
    graph = copy.deepcopy(bound.graph)
    calls = [node for node in graph.nodes if node.op == "call_function" and node.target is gemv_linear]
    for node in calls:
        node.target = torch.ops.aten.linear.default
    if not calls:
        log(f"SUMMARY GEMV R={rows}: no projection of this step has a GEMV tile (all cuBLAS)")
        return {"rows": rows, "calls": 0}
    cublas_module = torch.fx.GraphModule(bound, graph)
    state = {name: t.clone() for name, t in model.buffers.items() if isinstance(t, torch.Tensor)}
    ours = bound(*arguments)  # the step writes the cache and the pending tokens: the second starts from the same
    ours = [t.clone() if isinstance(t, torch.Tensor) else t for t in pytree.tree_leaves(ours)]
    for name, tensor in state.items():
        model.buffers[name].copy_(tensor)
    agreement = _agreement(ours, cublas_module(*arguments))
    del state
    tiled = lever_ab.graph_ms(lambda: bound(*arguments), replays=60)
    cublas = lever_ab.graph_ms(lambda: cublas_module(*arguments), replays=60)
    log(f"SUMMARY GEMV R={rows}: decode step {tiled:.3f} ms with {len(calls)} projections on the Triton GEMV, "
        f"{cublas:.3f} ms with all on cuBLAS ({cublas / tiled:.3f}x); outputs: {agreement}")
    return {"rows": rows, "calls": len(calls), "gemv_ms": tiled, "cublas_ms": cublas, "outputs": agreement}


def rotary_step_ab(model, rows: int) -> dict:
    """The greedy decode step at `rows` as captured (each layer's rotary cache write and attention one
    ``helios::rotary_paged_attention`` call, `helios.runtime.loading.rotary_calls`) against the same
    graph with the pairs split back into two calls: device ms per replay of each, from the same
    buffers, and whether the sampled tokens agree."""
    from helios.runtime.loading.rotary_calls import prefetch_output_weights, rotary_module, split_rotary_attention

    program = next((p for p in lever_ab.decode_programs(model) if p.batch_capacity == rows), None)
    if program is None:
        return {}
    arguments = program_arguments(program, model.weights, model.buffers)
    # the served graph, fused here when capture left the pairs as they are (FUSE_AT_CAPTURE off)
    fused = rotary_module(variant_module(lever_ab._eager(program), SampleVariant.GREEDY), enabled=True)
    graph = copy.deepcopy(fused.graph)
    count = split_rotary_attention(graph)
    if not count:
        log(f"SUMMARY ROTARY R={rows}: the captured step has no fused rotary attention call")
        return {"rows": rows, "calls": 0}
    split_module = torch.fx.GraphModule(fused, graph)
    hinted_graph = copy.deepcopy(fused.graph)
    hints = prefetch_output_weights(hinted_graph)
    hinted = torch.fx.GraphModule(fused, hinted_graph)
    state = {name: t.clone() for name, t in model.buffers.items() if isinstance(t, torch.Tensor)}
    ours = [t.clone() if isinstance(t, torch.Tensor) else t for t in pytree.tree_leaves(fused(*arguments))]
    for name, tensor in state.items():
        model.buffers[name].copy_(tensor)
    agreement = _agreement(ours, split_module(*arguments))
    for name, tensor in state.items():
        model.buffers[name].copy_(tensor)
    hinted_agreement = _agreement(ours, hinted(*arguments))
    for name, tensor in state.items():
        model.buffers[name].copy_(tensor)
    del state
    one, two, three = [], [], []
    for _ in range(3):  # alternated, medians of each
        one.append(lever_ab.graph_ms(lambda: fused(*arguments), replays=40))
        two.append(lever_ab.graph_ms(lambda: split_module(*arguments), replays=40))
        three.append(lever_ab.graph_ms(lambda: hinted(*arguments), replays=40))
    one_ms, two_ms, three_ms = sorted(one)[1], sorted(two)[1], sorted(three)[1]
    log(f"SUMMARY PREFETCH R={rows}: decode step {three_ms:.3f} ms with {hints} fused calls prefetching the output "
        f"projection's weight into L2, {one_ms:.3f} ms without ({one_ms / three_ms:.3f}x); outputs: {hinted_agreement}")
    layers = count
    log(f"SUMMARY ROTARY R={rows}: decode step {one_ms:.3f} ms with {count} fused rotary+attention calls, "
        f"{two_ms:.3f} ms with the pairs split ({two_ms / one_ms:.3f}x; {1e3 * (two_ms - one_ms) / layers:.2f} us "
        f"per layer); outputs: {agreement}")
    return {"rows": rows, "calls": count, "fused_ms": one_ms, "split_ms": two_ms, "prefetch_ms": three_ms,
            "outputs": agreement, "prefetch_outputs": hinted_agreement}


def _agreement(ours, theirs) -> str:
    """How the step's outputs compare: integer outputs (tokens) equal or not, float outputs' largest
    difference."""
    pairs = [(a, b) for a, b in zip(pytree.tree_leaves(ours), pytree.tree_leaves(theirs))
             if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape]
    exact = [torch.equal(a, b) for a, b in pairs if not a.is_floating_point()]
    spread = max((float((a.float() - b.float()).abs().max()) for a, b in pairs if a.is_floating_point() and a.numel()),
                 default=0.0)
    return f"{sum(exact)}/{len(exact)} integer outputs equal, float outputs within {spread:.3g}"


def summarize(profile: dict, layers: int, wall_ms: float) -> None:
    """One line per profiled step: ms by kind and per layer, fills, replay against the kernel sum and
    against the served wall time per decode step (`wall_ms`: what the host adds that the second
    execution frame does not hide)."""
    if not profile:
        return
    kinds = profile["by_kind_ms"]
    fills = [entry for entry in profile["top"] if "fill" in entry["kernel"].lower()]
    fill_ms = sum(entry["ms"] for entry in fills)
    attention, matmul = (kinds.get(kind, 0.0) / layers * 1e3 for kind in ("attention", "matmul"))
    log(f"SUMMARY R={profile['rows']}: {profile['kernels']} kernels, {profile['kernel_ms']:.3f} ms kernel time, "
        f"replay {profile['graph_replay_ms']:.3f} ms, served {wall_ms:.3f} ms wall per step; attention "
        f"{attention:.1f} us per layer, matmul {matmul:.1f} us per layer; fill kernels among the top: "
        f"{len(fills)} ({fill_ms:.3f} ms)")


if __name__ == "__main__":
    sys.exit(main())
