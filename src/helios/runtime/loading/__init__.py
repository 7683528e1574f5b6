"""Loading a verified core: programs (`model`), streamed weights, memory checks and page sizing,
CPU and CUDA-graph preparation of programs, graph passes and rewrites, startup tuning and
speculative facts. Uses no other room."""

import warnings

# Loading rewrites copies of programs' graphs (`copy.deepcopy(module.graph)`); copying a graph copies
# its codegen's pytree specs, and torch's own copy of a spec warns that `isinstance(treespec, LeafSpec)`
# is deprecated (a FutureWarning raised inside torch, attributed to copyreg): on a served start it
# reached the operator's terminal, twice, with nothing to act on. Only that message is silenced.
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                        category=FutureWarning)
