"""A compiled CPU kernel for a step's cache writes (``--compile-programs``).

In a compiled CPU program every layer writes its new keys and values into the cache planes through
`helios.abi.cpu_bodies.cache_write_planned`: two ``index_copy_`` calls over the step's slots, about
12-14 us a layer at 16 rows in a step, most of it ATen's per-call setup for copying 16 rows of a
few hundred bytes. `KERNEL_SOURCE` copies each token's key and value rows to their slots in one C++
call built at load through Inductor's C++ toolchain (as the decode attention kernel,
`helios.runtime.loading.decode_attention_kernel`). It copies bytes: the planes hold exactly what
the two ``index_copy_`` calls write.

`cache_write(kernel)` is the body a compiled program calls instead of `cache_write_planned`: the
kernel when every token is written (the slot plan keeps them all), the slots are int64, and the
rows and planes are float32 CPU tensors with contiguous heads; `cache_write_planned` otherwise.
`bind_cache_writes(graph, kernel)` points a program graph's planned cache writes at it.

Thread ownership: the kernel is built at load; calls run on the model worker.
"""

from __future__ import annotations

from typing import Callable

import torch

from helios.abi import cpu_bodies
from helios.abi.cpu_bodies import SlotPlan
from helios.runtime.loading.cpp_kernels import build_cpp_kernel, layouts

# Shared with the rotary kernel (`helios.runtime.loading.fused_cpu_kernels`), which writes slots too.
SLOTS_INSIDE = r"""
// Whether each of the `tokens` slots lies in 0..plane_slots - 1.
static bool slots_inside(const int64_t* slots, int64_t tokens, int64_t plane_slots) {
    for (int64_t t = 0; t < tokens; ++t)
        if (slots[t] < 0 || slots[t] >= plane_slots) return false;
    return true;
}
"""

KERNEL_SOURCE = r"""
#include <cstdint>
#include <cstring>
""" + SLOTS_INSIDE + r"""

// Token t's key row (k + t * k_row, width floats) to slot slots[t] of the k plane (slot * slot_stride
// floats in), its value row likewise. With a slot outside 0..plane_slots - 1 it writes nothing and
// sets status[0] to 1 (the caller then runs the reference, which names the error).
extern "C" void kernel(float* k_plane, float* v_plane, const float* k, const float* v, const int64_t* slots,
                       int64_t tokens, int64_t width, int64_t k_row, int64_t v_row, int64_t slot_stride,
                       int64_t plane_slots, int64_t* status) {
    status[0] = slots_inside(slots, tokens, plane_slots) ? 0 : 1;
    if (status[0]) return;
    for (int64_t t = 0; t < tokens; ++t) {
        std::memcpy(k_plane + slots[t] * slot_stride, k + t * k_row, width * sizeof(float));
        std::memcpy(v_plane + slots[t] * slot_stride, v + t * v_row, width * sizeof(float));
    }
}
"""

_ARGUMENT_TYPES = ("float*", "float*", "const float*", "const float*", "const int64_t*", *("int64_t",) * 6,
                   "int64_t*")
def build_kernel() -> Callable:
    """The compiled kernel (`build_cpp_kernel`: once per process)."""
    return build_cpp_kernel(_ARGUMENT_TYPES, KERNEL_SOURCE)


def cache_write(kernel: Callable) -> Callable:
    """`cache_write_planned` (k_cache, v_cache, k, v, plan) through `kernel` where it applies (see
    the module docstring), `cache_write_planned` elsewhere (and where a slot is outside the planes,
    so that the reference raises its error). The checks are made again only when a call's tensors
    differ in dtype, device, shape or strides from the last checked call's (`layouts`: a program's
    call site passes the same layouts every step)."""
    status = torch.zeros(1, dtype=torch.int64)
    state = status.numpy()  # a view: what the kernel last wrote
    last: list = [None, False]  # the layouts' signature, whether the kernel applies

    def cache_write_kernel(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           plan: SlotPlan) -> None:
        slots = plan.slots
        signature = layouts(k_cache, v_cache, k, v, slots)
        if signature != last[0]:
            last[:] = signature, kernel_applies(k_cache, v_cache, k, v, slots)
        if not last[1] or plan.keep is not None:
            return cpu_bodies.cache_write_planned(k_cache, v_cache, k, v, plan)
        kernel(k_cache, v_cache, k, v, slots, k.shape[0], k.shape[1] * k.shape[2], k.stride(0), v.stride(0),
               k_cache.stride(1), k_cache.shape[0] * k_cache.shape[1], status)
        if state[0]:
            return cpu_bodies.cache_write_planned(k_cache, v_cache, k, v, plan)
        return None
    return cache_write_kernel


def kernel_applies(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   slots: torch.Tensor) -> bool:
    """Whether the kernel takes these tensors (whether every token is written is the plan's, per
    call): int64 slots (contiguous, one per token), float32 CPU tensors, rows [T, Hkv, D] with
    contiguous heads, and planes [pages, page tokens, Hkv, D] whose slots are evenly spaced (a
    slot's row at slot * token stride) with the rows' shape."""
    if slots.dtype != torch.int64 or not slots.is_contiguous():
        return False
    tensors = (k_cache, v_cache, k, v)
    if any(t.dtype != torch.float32 or t.device.type != "cpu" for t in tensors) or slots.device.type != "cpu":
        return False
    if k.dim() != 3 or k.shape != v.shape or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        return False
    if slots.shape != (k.shape[0],) or k_cache.shape[2:] != k.shape[1:]:
        return False
    dim = k.shape[2]
    rows_contiguous = k.stride()[1:] == (dim, 1) and v.stride()[1:] == (dim, 1) and k_cache.stride()[2:] == (dim, 1)
    return rows_contiguous and k_cache.stride(0) == k_cache.shape[1] * k_cache.stride(1) \
        and k_cache.stride() == v_cache.stride()


def bind_cache_writes(graph: torch.fx.Graph, kernel: Callable) -> int:
    """Points every `cache_write_planned` call of `graph` at `cache_write(kernel)` (one body per call,
    holding its checks); returns how many."""
    count = 0
    for node in graph.nodes:
        if node.op == "call_function" and node.target is cpu_bodies.cache_write_planned:
            node.target = cache_write(kernel)
            count += 1
    return count
