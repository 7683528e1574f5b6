"""The sampled op at 256 rows of a 128k vocabulary in a CUDA graph: row-blocked (the default) against
one block (session 52), replays timed with CUDA events, alternated; also each graph's pool peak."""
import statistics
import sys

import torch

sys.path.insert(0, "tests")
from helios.abi import sampling, token_logprobs  # noqa: F401,E402
from support.abi_inputs import sample_inputs  # noqa: E402
from support.cuda_calls import to_cuda  # noqa: E402


def graph_of(op, static, elements):
    sampling.ROW_BLOCK_ELEMENTS = elements
    for _ in range(2):
        op(**static)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = op(**static)
    peak = torch.cuda.max_memory_allocated() - before
    return graph, out, peak


def timed(graph, replays=20):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / replays


static = to_cuda(sample_inputs(256, 128256, seed=5))
op = torch.ops.helios.sample
sizes = [int(x) for x in (sys.argv[1].split(",") if len(sys.argv) > 1 else ["4194304", str(1 << 62)])]
graphs = {size: graph_of(op, static, size) for size in sizes}
times = {size: [] for size in sizes}
for _ in range(8):
    for size, (graph, _, _) in graphs.items():
        times[size].append(timed(graph, 10))
whole = statistics.median(times[sizes[-1]])
for size in sizes:
    t = statistics.median(times[size])
    print(f"sample 256 x 128256 in a graph, {min(256, size // 128256)} rows a block: {t:.3f} ms, {t / whole:.3f}x one block; "
          f"capture peak {graphs[size][2] / 2**30:.2f} GiB; same tokens {bool(torch.equal(graphs[size][1], graphs[sizes[-1]][1]))}")
