"""bench/load_memory.py with session 52's capture: one-shot draws and logprobs, no cache release before capture."""
import runpy
import sys

sys.path.insert(0, "bench")
from helios.abi import sampling  # noqa: E402
from helios.runtime.loading import cuda_graphs  # noqa: E402

sampling.ROW_BLOCK_ELEMENTS = 1 << 62


def _record(module, arguments, pool, warmups):
    cuda_graphs._warm_up(module, arguments, warmups)
    return cuda_graphs._record_graph(module, arguments, pool)


cuda_graphs._record = _record
sys.argv[0] = "bench/load_memory.py"
runpy.run_path("bench/load_memory.py", run_name="__main__")
