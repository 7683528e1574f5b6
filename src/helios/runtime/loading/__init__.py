"""Loading a verified core: programs (`model`), streamed weights, memory checks and page sizing,
CPU and CUDA-graph preparation of programs, graph passes and rewrites, startup tuning and
speculative facts. Uses no other room."""
