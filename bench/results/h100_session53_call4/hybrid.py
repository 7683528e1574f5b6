import statistics, sys
import torch
sys.path.insert(0, "tests")
from helios.abi import sampling
from helios.abi.rng import SAMPLE_OFFSET, philox_words, uniform53
from support.abi_inputs import sample_inputs
from support.cuda_calls import to_cuda

def with_draws_h(tokens, logits, drawing, params, select_rows):
    R, V = logits.shape
    blocks = sampling.row_blocks(R, V)
    temperature = torch.where(drawing, params.temperature, 1.0).to(torch.float64).unsqueeze(-1)
    probs = torch.empty((R, V), dtype=torch.float64, device=logits.device)
    for rows in blocks:
        scaled = torch.where(drawing[rows].unsqueeze(-1), logits[rows], 0.0) / temperature[rows]
        probs[rows] = torch.softmax(sampling._finite_or_neg_inf(scaled, sampling._F64_MAX), dim=-1)
    sorted_probs, sorted_ids = torch.sort(probs, dim=-1, descending=True, stable=True)
    del probs
    uniform = uniform53(philox_words(params.seeds, params.counters, SAMPLE_OFFSET))
    out = []
    for rows in blocks:
        sp = sorted_probs[rows]
        keep = sampling.keep_prefix(sp, params.top_k[rows], params.top_p[rows], params.min_p[rows])
        weights = torch.where(keep, sp, 0.0)
        cumulative = weights.cumsum(dim=-1)
        position = (cumulative <= (uniform[rows] * cumulative[:, -1]).unsqueeze(-1)).sum(dim=-1)
        last = ((weights > 0).sum(dim=-1) - 1).clamp(min=0)
        out.append(sorted_ids[rows].gather(1, torch.minimum(position, last).unsqueeze(-1)).squeeze(-1))
    return torch.where(drawing, torch.cat(out), tokens)

def graph_of(static, elements, hybrid):
    sampling.ROW_BLOCK_ELEMENTS = elements
    sampling.with_draws = with_draws_h if hybrid else original
    op = torch.ops.helios.sample
    for _ in range(2):
        op(**static)
    torch.cuda.synchronize(); torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated(); torch.cuda.reset_peak_memory_stats()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = op(**static)
    return g, out, torch.cuda.max_memory_allocated() - before

def timed(g, n=10):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n):
        g.replay()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / n

original = sampling.with_draws
static = to_cuda(sample_inputs(256, 128256, seed=5))
arms = {"one block": graph_of(static, 1 << 62, False), "blocked 32": graph_of(static, 1 << 22, False),
        "hybrid 32": graph_of(static, 1 << 22, True), "hybrid 64": graph_of(static, 1 << 23, True)}
times = {k: [] for k in arms}
for _ in range(8):
    for k, (g, _, _) in arms.items():
        times[k].append(timed(g))
base = statistics.median(times["one block"])
for k, (g, out, peak) in arms.items():
    t = statistics.median(times[k])
    print(f"{k}: {t:.3f} ms, {t / base:.3f}x; peak {peak / 2**30:.2f} GiB; same tokens {bool(torch.equal(out, arms['one block'][1]))}")
