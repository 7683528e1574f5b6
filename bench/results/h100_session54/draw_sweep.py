"""Configurations of the sort-free draw kernel (module knobs) against the sorted device path, in CUDA graphs, one process;
plus the share of the two whole-row passes."""
import statistics
import sys

import torch

sys.path.insert(0, ".anchor")
sys.path.insert(0, "tests")
from helios.abi import triton_draws  # noqa: E402
from helios.abi.sampling import SampleVariant  # noqa: E402
from draw_bench import OPS, capture, inputs_for, sorted_path, timed, SETTINGS  # noqa: E402

CONFIGS = {
    "G2 st1 w8": dict(FIRST_GROUP=2, STAGES=1, SELECT_WARPS=8),
    "G2 st1 w16": dict(FIRST_GROUP=2, STAGES=1, SELECT_WARPS=16),
    "G3 st1 w8": dict(FIRST_GROUP=3, STAGES=1, SELECT_WARPS=8),
    "G1 st1 w8": dict(FIRST_GROUP=1, STAGES=1, SELECT_WARPS=8),
    "G2 st1 w4": dict(FIRST_GROUP=2, STAGES=1, SELECT_WARPS=4),
}


def configure(config):
    for name, value in config.items():
        setattr(triton_draws, name, value)
    triton_draws.SELECT_BLOCK = 32 * triton_draws.SELECT_WARPS


def rows_only(logits, seeds, counters, temperature, top_k, top_p, min_p, penalties, prompt_counts, output_counts,
              grammar_mask, mask_rows):
    """The two whole-row passes alone (the selection kernel left out)."""
    d = triton_draws
    R, V = logits.shape
    values = logits.to(torch.float64)
    greedy = logits.argmax(-1)
    drawing = temperature > 0
    chunk = -(-V // (d.SPLITS * d.ROW_BLOCK)) * d.ROW_BLOCK
    dev = logits.device
    bests = torch.empty((R,), dtype=torch.float64, device=dev)
    sums = torch.empty((R, d.SPLITS), dtype=torch.float64, device=dev)
    counts = torch.empty((R, d.SPLITS, 2), dtype=torch.int64, device=dev)
    bc = torch.empty((R, d.SPLITS, d.NUM_BUCKETS), dtype=torch.int64, device=dev)
    bm = torch.empty((R, d.SPLITS, d.NUM_BUCKETS), dtype=torch.float64, device=dev)
    rows = (values, values.stride(0), drawing, temperature, bests, sums)
    d._exp_sum_kernel[(R, d.SPLITS)](*rows, greedy, V, chunk, S=d.SPLITS, BLOCK_V=d.ROW_BLOCK, num_warps=d.ROW_WARPS)
    d._probability_kernel[(R, d.SPLITS)](*rows, min_p, counts, bc, bm, V, chunk, S=d.SPLITS, BLOCK_V=d.ROW_BLOCK,
                                         NB=d.NUM_BUCKETS, GROUP=d.FIRST_GROUP, num_warps=d.ROW_WARPS)
    cp = torch.empty((R, V), dtype=torch.float64, device=dev)
    ci = torch.empty((R, V), dtype=torch.int32, device=dev)
    d._partition_kernel[(R, d.SPLITS)](*rows, bc, cp, ci, V, chunk, S=d.SPLITS, BLOCK_V=d.ROW_BLOCK, NB=d.NUM_BUCKETS,
                                       GROUP=d.FIRST_GROUP, num_warps=d.ROW_WARPS)
    return ci


results = {}
for rows in (1, 8, 64, 256):
    for shape in ("flat", "peaked"):
        for name, settings in SETTINGS.items():
            static = inputs_for(rows, shape, settings)
            g_old, out_old = capture(sorted_path, static)
            g_greedy, _ = capture(SampleVariant.GREEDY, static)
            graphs = {}
            for label, config in CONFIGS.items():
                configure(config)
                graphs[label] = capture(OPS.sample, static)
            configure(CONFIGS["G2 st1 w8"])
            g_rows, _ = capture(rows_only, static)
            times = {key: [] for key in ["old", "greedy", "rows", *CONFIGS]}
            for _ in range(5):
                times["old"].append(timed(g_old))
                times["greedy"].append(timed(g_greedy))
                times["rows"].append(timed(g_rows))
                for label, (graph, _) in graphs.items():
                    times[label].append(timed(graph))
            med = {key: statistics.median(value) for key, value in times.items()}
            cells = "  ".join(f"{label} {med['old'] / med[label]:5.2f}x" for label in CONFIGS)
            same = min(int((out == out_old).sum()) for _, out in graphs.values())
            print(f"R={rows:3d} {shape:6s} {name:26s} sorted/kernel: {cells}; whole-row passes "
                  f"{med['rows'] / med['G2 st1 w8']:.2f} of the kernel; sorted {med['old'] / med['greedy']:.0f}x greedy; "
                  f"same tokens >= {same}/{rows}", flush=True)
            del graphs, g_old, g_greedy, g_rows
    torch.cuda.empty_cache()
