"""Where the sampled op's time goes at R rows x 128k (all rows drawing, no penalties), each stage in its own CUDA graph."""
import statistics
import sys

import torch

sys.path.insert(0, "tests")
from helios.abi import sampling  # noqa: E402
from helios.abi.rng import SAMPLE_OFFSET, philox_words, uniform53  # noqa: E402

V = 128256


def capture(fn):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def timed(graph, replays=10):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / replays


for R in (64, 256):
    g = torch.Generator(device="cuda").manual_seed(0)
    logits32 = torch.randn(R, V, device="cuda", generator=g) * 3
    values = logits32.to(torch.float64)
    temp = torch.full((R,), 0.8, device="cuda")
    seeds = torch.arange(R, device="cuda", dtype=torch.int64)
    counters = torch.zeros(R, device="cuda", dtype=torch.int64)
    top_k = torch.zeros(R, device="cuda", dtype=torch.int32)
    top_p = torch.full((R,), 0.95, device="cuda")
    min_p = torch.zeros(R, device="cuda")
    params = sampling.DrawParams(seeds, counters, temp, top_k, top_p, min_p)
    probs = torch.softmax(values / 0.8, dim=-1)
    sorted_probs, sorted_ids = torch.sort(probs, dim=-1, descending=True, stable=True)
    keep = sampling.keep_prefix(sorted_probs, top_k, top_p, min_p)
    weights = torch.where(keep, sorted_probs, 0.0)
    stages = {
        "draw_tokens (all)": lambda: sampling.draw_tokens(values, params),
        "scale+softmax f64": lambda: torch.softmax(sampling._finite_or_neg_inf(values / temp.double().unsqueeze(-1), 1e308), dim=-1),
        "sort f64 stable+ids": lambda: torch.sort(probs, dim=-1, descending=True, stable=True),
        "sort f32 stable+ids": lambda: torch.sort(logits32, dim=-1, descending=True, stable=True),
        "sort f64 unstable": lambda: torch.sort(probs, dim=-1, descending=True),
        "keep_prefix": lambda: sampling.keep_prefix(sorted_probs, top_k, top_p, min_p),
        "where+cumsum": lambda: torch.where(keep, sorted_probs, 0.0).cumsum(dim=-1),
        "cumsum f64": lambda: sorted_probs.cumsum(dim=-1),
        "draw tail": lambda: ((weights.cumsum(-1) <= (uniform53(philox_words(seeds, counters, SAMPLE_OFFSET)) * 0.5).unsqueeze(-1)).sum(-1)),
        "topk 1024 f32": lambda: torch.topk(logits32, 1024, dim=-1),
        "one f64 pass (mul)": lambda: probs * 2.0,
    }
    graphs = {name: capture(fn)[0] for name, fn in stages.items()}
    times = {name: [] for name in stages}
    for _ in range(5):
        for name, graph in graphs.items():
            times[name].append(timed(graph))
    total = statistics.median(times["draw_tokens (all)"])
    for name in stages:
        t = statistics.median(times[name])
        print(f"R={R} {name:24s} {t:8.3f} ms  {t / total:6.3f} of draw_tokens")
    del graphs
    torch.cuda.empty_cache()
