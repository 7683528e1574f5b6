"""C++ kernels for a CPU program's per-layer ABI bodies: RMSNorm, add + RMSNorm, SiLU-mul, and
rotary + cache write.

On the CPU a small model's decode step runs each of these ops as a handful of torch calls
(`helios.abi.cpu_bodies`): ``rms_norm`` five (square, mean, add, reciprocal square root, two
products), ``add_rms_norm`` one more, ``silu_mul`` two and a rotary cache write (rotate q and k as
one view, two copies into the planes) about eight, each a few microseconds of dispatch around a
few hundred floats. At 16 rows of the embedded model they took 0.33 ms of a 1.8 ms step. Each
kernel here does its op in one C++ call built through Inductor's C++ toolchain
(`helios.runtime.loading.cpp_kernels`), vectorised with ATen's ``Vectorized``:

- `NORM_SOURCE`: each row's sum of squares, ``x * (1 / sqrt(sum / width + eps)) * weight`` (the
  body's order of products), and for ``add_rms_norm`` the sum ``x + delta`` written first (bit for
  bit). The sum of squares adds in another order than torch's reduction, so the normed rows equal
  the body's within float rounding;
- `SILU_MUL_SOURCE`: ``gate / (1 + exp(-gate)) * up`` (ATen's SiLU formula, its vectorised
  ``exp``), within float rounding of the body (the same on this machine's tests bit for bit);
- `ROTARY_SOURCE`: ``x * cos + roll(x, D / 2) * signed_sin`` for q's and k's heads (two products
  and a sum, the first half's negated sine applied as a subtraction, no fused multiply-add:
  Inductor's toolchain compiles with ``-ffp-contract=off``), the rotated q returned contiguous,
  the rotated k and the v rows copied to their slots: bit for bit what
  `cpu_bodies.rotary_cache_write_planned` gives and writes. Its step plan keeps the sine as given
  (`KernelRotaryPlan`: the signed sine made only if a body needs it). A slot outside the planes
  writes nothing and the body runs (and raises its error).

Each `*_body(kernel)` returns the replacement of a `cpu_bodies` function: the kernel where it
takes the tensors (float32 CPU tensors of the layouts the docstrings name; checked again only
when a call's layouts differ from the last call's, as a program's call site passes the same ones
every step), the body otherwise. `bind_fused_kernels(graph, kernels)` points a program graph's
calls at them.

Thread ownership: the kernels are built at load; calls run on the model worker.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from helios.abi import cpu_bodies
from helios.abi.cpu_bodies import RotaryPlan
from helios.runtime.loading.cache_write_kernel import SLOTS_INSIDE
from helios.runtime.loading.cpp_kernels import build_cpp_kernel, layouts

_F32 = torch.float32

NORM_SOURCE = r"""
#include <torch/csrc/inductor/cpp_prefix.h>
#include <cmath>

using Vec = at::vec::Vectorized<float>;

// out = x * (1 / sqrt(mean(x^2) + eps)) * weight over each of `rows` rows of `width` floats; with
// `add`, x is first replaced by x + delta, written to summed.
extern "C" void kernel(float* out, float* summed, const float* x, const float* delta, const float* weight,
                       int64_t rows, int64_t width, int64_t x_row, int64_t delta_row, int64_t add, float eps) {
    constexpr int64_t W = Vec::size();
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * x_row;
        float* o = out + r * width;
        if (add) {
            float* s = summed + r * width;
            const float* dr = delta + r * delta_row;
            int64_t i = 0;
            for (; i + W <= width; i += W) (Vec::loadu(xr + i) + Vec::loadu(dr + i)).store(s + i);
            for (; i < width; ++i) s[i] = xr[i] + dr[i];
            xr = s;
        }
        Vec acc(0.f);
        int64_t i = 0;
        for (; i + W <= width; i += W) {
            const Vec v = Vec::loadu(xr + i);
            acc = acc + v * v;
        }
        float total = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, acc);
        for (; i < width; ++i) total += xr[i] * xr[i];
        const float scale = 1.f / std::sqrt(total / (float)width + eps);
        const Vec s(scale);
        for (i = 0; i + W <= width; i += W) ((Vec::loadu(xr + i) * s) * Vec::loadu(weight + i)).store(o + i);
        for (; i < width; ++i) o[i] = (xr[i] * scale) * weight[i];
    }
}
"""

SILU_MUL_SOURCE = r"""
#include <torch/csrc/inductor/cpp_prefix.h>
#include <cmath>

using Vec = at::vec::Vectorized<float>;

// out[r] = silu(gate_up[r, :width]) * gate_up[r, width:], rows `row` floats apart.
extern "C" void kernel(float* out, const float* gate_up, int64_t rows, int64_t width, int64_t row) {
    constexpr int64_t W = Vec::size();
    const Vec one(1.f);
    for (int64_t r = 0; r < rows; ++r) {
        const float* g = gate_up + r * row;
        const float* u = g + width;
        float* o = out + r * width;
        int64_t i = 0;
        for (; i + W <= width; i += W) {
            const Vec x = Vec::loadu(g + i);
            ((x / (one + x.neg().exp())) * Vec::loadu(u + i)).store(o + i);
        }
        for (; i < width; ++i) o[i] = (g[i] / (1.f + std::exp(-g[i]))) * u[i];
    }
}
"""

ROTARY_SOURCE = r"""
#include <torch/csrc/inductor/cpp_prefix.h>
#include <cstring>
""" + SLOTS_INSIDE + r"""

using Vec = at::vec::Vectorized<float>;

// out = x * cos + roll(x, half) * signed_sin over one head of dim floats (roll: out[d] reads
// x[d - half mod dim]; signed_sin: sin with its first half negated, applied as a subtraction there,
// which IEEE arithmetic makes the same bits).
static inline void rotate(float* out, const float* x, const float* cos, const float* sin, int64_t dim, int64_t half) {
    constexpr int64_t W = Vec::size();
    if (half % W == 0) {
        for (int64_t d = 0; d < half; d += W)
            (Vec::loadu(x + d) * Vec::loadu(cos + d) - Vec::loadu(x + d + half) * Vec::loadu(sin + d)).store(out + d);
        for (int64_t d = half; d < dim; d += W)
            (Vec::loadu(x + d) * Vec::loadu(cos + d) + Vec::loadu(x + d - half) * Vec::loadu(sin + d)).store(out + d);
        return;
    }
    for (int64_t d = 0; d < half; ++d) {
        const float product = x[d] * cos[d];
        const float other = x[d + half] * sin[d];
        out[d] = product - other;
    }
    for (int64_t d = half; d < dim; ++d) {
        const float product = x[d] * cos[d];
        const float other = x[d - half] * sin[d];
        out[d] = product + other;
    }
}

// Rotates q's heads into q_out (contiguous) and k's into the k plane at each token's slot, copies
// v's rows to the v plane. A slot outside 0..plane_slots - 1: nothing written, status[0] = 1.
extern "C" void kernel(float* q_out, float* k_plane, float* v_plane, const float* q, const float* k, const float* v,
                       const float* cos, const float* sin, const int64_t* slots, int64_t tokens, int64_t q_heads,
                       int64_t kv_heads, int64_t dim, int64_t half, int64_t q_row, int64_t q_head, int64_t k_row,
                       int64_t k_head, int64_t v_row, int64_t v_head, int64_t cos_row, int64_t sin_row,
                       int64_t slot_stride, int64_t plane_slots, int64_t* status) {
    status[0] = slots_inside(slots, tokens, plane_slots) ? 0 : 1;
    if (status[0]) return;
    for (int64_t t = 0; t < tokens; ++t) {
        const float* c = cos + t * cos_row;
        const float* s = sin + t * sin_row;
        for (int64_t h = 0; h < q_heads; ++h)
            rotate(q_out + (t * q_heads + h) * dim, q + t * q_row + h * q_head, c, s, dim, half);
        float* k_slot = k_plane + slots[t] * slot_stride;
        float* v_slot = v_plane + slots[t] * slot_stride;
        for (int64_t h = 0; h < kv_heads; ++h) {
            rotate(k_slot + h * dim, k + t * k_row + h * k_head, c, s, dim, half);
            std::memcpy(v_slot + h * dim, v + t * v_row + h * v_head, dim * sizeof(float));
        }
    }
}
"""

_NORM_TYPES = ("float*", "float*", "const float*", "const float*", "const float*", *("int64_t",) * 5, "float")
_SILU_MUL_TYPES = ("float*", "const float*", "int64_t", "int64_t", "int64_t")
_ROTARY_TYPES = ("float*", "float*", "float*", "const float*", "const float*", "const float*", "const float*",
                 "const float*", "const int64_t*", *("int64_t",) * 15, "int64_t*")


class FusedKernels(NamedTuple):
    """The built kernels (`build_kernels`)."""

    norm: Callable
    silu_mul: Callable
    rotary: Callable


def build_kernels() -> FusedKernels:
    """The compiled kernels (`build_cpp_kernel`: each once per process). Raises what the toolchain
    raises when it cannot build one."""
    return FusedKernels(build_cpp_kernel(_NORM_TYPES, NORM_SOURCE), build_cpp_kernel(_SILU_MUL_TYPES, SILU_MUL_SOURCE),
                        build_cpp_kernel(_ROTARY_TYPES, ROTARY_SOURCE))


def _rows_of(x: torch.Tensor) -> int | None:
    """The row stride of a float32 CPU tensor read as rows of its last dimension (the last stride 1,
    every leading index a whole row apart), or None."""
    if x.dtype != _F32 or x.device.type != "cpu" or x.dim() < 1 or x.shape[-1] == 0 or x.stride(-1) != 1:
        return None
    if x.dim() == 1:
        return x.shape[0]
    if x.dim() == 2:
        return x.stride(0)
    return x.shape[-1] if x.is_contiguous() else None


def _weight_fits(weight: torch.Tensor, width: int) -> bool:
    return weight.dtype == _F32 and weight.device.type == "cpu" and weight.shape == (width,) and weight.stride(0) == 1


def rms_norm_body(kernel: Callable) -> Callable:
    """`cpu_bodies.rms_norm` (x, weight, eps) through the norm kernel for float32 rows (`_rows_of`)
    and a float32 weight of their width."""
    last: list = [None, None]  # signature, x's row stride or None

    def rms_norm_kernel(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        signature = layouts(x, weight)
        if signature != last[0]:
            row = _rows_of(x)
            last[:] = signature, row if row is not None and _weight_fits(weight, x.shape[-1]) else None
        if last[1] is None:
            return cpu_bodies.rms_norm(x, weight, eps)
        out = torch.empty(x.shape, dtype=_F32)
        width = x.shape[-1]
        kernel(out, out, x, x, weight, x.numel() // width, width, last[1], last[1], 0, float(eps))
        return out
    return rms_norm_kernel


def add_rms_norm_body(kernel: Callable) -> Callable:
    """`cpu_bodies.add_rms_norm` (x, delta, weight, eps) through the norm kernel for float32 rows of
    one shape (`_rows_of`) and a float32 weight of their width."""
    last: list = [None, None]  # signature, (x's, delta's row strides) or None

    def add_rms_norm_kernel(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                            eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        signature = layouts(x, delta, weight)
        if signature != last[0]:
            rows = (_rows_of(x), _rows_of(delta))
            fits = None not in rows and x.shape == delta.shape and _weight_fits(weight, x.shape[-1])
            last[:] = signature, rows if fits else None
        if last[1] is None:
            return cpu_bodies.add_rms_norm(x, delta, weight, eps)
        summed, out = torch.empty(x.shape, dtype=_F32), torch.empty(x.shape, dtype=_F32)
        width = x.shape[-1]
        kernel(out, summed, x, delta, weight, x.numel() // width, width, last[1][0], last[1][1], 1, float(eps))
        return summed, out
    return add_rms_norm_kernel


def silu_mul_body(kernel: Callable) -> Callable:
    """`cpu_bodies.silu_mul` (gate_up [T, 2I]) through the SiLU-mul kernel for float32 rows with a
    unit last stride."""
    last: list = [None, None]  # signature, the row stride or None

    def silu_mul_kernel(gate_up: torch.Tensor) -> torch.Tensor:
        signature = layouts(gate_up)
        if signature != last[0]:
            row = _rows_of(gate_up) if gate_up.dim() == 2 and gate_up.shape[1] % 2 == 0 else None
            last[:] = signature, row
        if last[1] is None:
            return cpu_bodies.silu_mul(gate_up)
        width = gate_up.shape[1] // 2
        out = torch.empty((gate_up.shape[0], width), dtype=_F32)
        kernel(out, gate_up, gate_up.shape[0], width, last[1])
        return out
    return silu_mul_kernel


class KernelRotaryPlan:
    """`cpu_bodies.plan_rotary`'s step plan where the rotary kernel serves (`plan_rotary_kernel`): cos
    and sin as given, the write slots, and the signed sine (sin with its first half negated) that the
    body rotates with, made on first use only (the kernel applies the sign itself)."""

    __slots__ = ("cos", "sin", "half", "slots", "_signed")

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor, slots: cpu_bodies.SlotPlan) -> None:
        self.cos, self.sin, self.half, self.slots, self._signed = cos, sin, sin.shape[-1] // 2, slots, None

    @property
    def signed_sin(self) -> torch.Tensor:
        if self._signed is None:  # as `cpu_bodies.plan_rotary` makes it
            self._signed = torch.cat((-self.sin[..., :self.half], self.sin[..., self.half:]), dim=-1)
        return self._signed


def plan_rotary_kernel(cos: torch.Tensor, sin: torch.Tensor, slots: cpu_bodies.SlotPlan) -> KernelRotaryPlan:
    """`cpu_bodies.plan_rotary`'s replacement where every reader is a rotary kernel body."""
    return KernelRotaryPlan(cos, sin, slots)


def rotary_body(kernel: Callable) -> Callable:
    """`cpu_bodies.rotary_cache_write_planned` (q, k, v, k_cache, v_cache, plan) through the rotary
    kernel for a `KernelRotaryPlan` when every token is written (the slot plan keeps them all, int64
    slots) and the tensors fit `_rotary_fits`; the body otherwise (and where a slot is outside the
    planes)."""
    status = torch.zeros(1, dtype=torch.int64)
    state = status.numpy()  # a view: what the kernel last wrote
    last: list = [None, None]  # layout signature, the kernel's integer arguments (None: it does not apply)

    def rotary_cache_write_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                                  v_cache: torch.Tensor, plan: RotaryPlan | KernelRotaryPlan) -> torch.Tensor:
        if type(plan) is not KernelRotaryPlan:
            return cpu_bodies.rotary_cache_write_planned(q, k, v, k_cache, v_cache, plan)
        slots = plan.slots.slots
        signature = layouts(q, k, v, plan.cos, plan.sin, slots, k_cache, v_cache)
        if signature != last[0]:  # (the planes are new views of the layer's buffer every step)
            last[:] = signature, _rotary_arguments(q, k, v, k_cache, v_cache, plan)
        if last[1] is None or plan.slots.keep is not None:
            return cpu_bodies.rotary_cache_write_planned(q, k, v, k_cache, v_cache, plan)
        out = torch.empty(q.shape, dtype=_F32)
        kernel(out, k_cache, v_cache, q, k, v, plan.cos, plan.sin, slots, *last[1], status)
        if state[0]:
            return cpu_bodies.rotary_cache_write_planned(q, k, v, k_cache, v_cache, plan)
        return out
    return rotary_cache_write_kernel


def _rotary_arguments(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                      v_cache: torch.Tensor, plan: KernelRotaryPlan) -> tuple | None:
    """The rotary kernel's integer arguments for tensors of these layouts (sizes, strides, slots in
    the planes), or None where it does not take them (`_rotary_fits`)."""
    if not _rotary_fits(q, k, v, k_cache, v_cache, plan):
        return None
    tokens, q_heads, dim = q.shape
    return (tokens, q_heads, k.shape[1], dim, plan.half, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            v.stride(0), v.stride(1), plan.cos.stride(0), plan.sin.stride(0), k_cache.stride(1),
            k_cache.shape[0] * k_cache.shape[1])


def _rotary_fits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 plan: KernelRotaryPlan) -> bool:
    """float32 CPU tensors: q [T, Hq, D], k and v [T, Hkv, D] with unit last strides; cos and the
    sine one row of D per token ([T, D] or [T, 1, D], unit last stride); int64 contiguous
    slots [T]; planes [pages, page tokens, Hkv, D] of one layout whose slots are evenly spaced, with
    contiguous heads; D even and half of it `plan.half`."""
    tensors = (q, k, v, k_cache, v_cache, plan.cos, plan.sin)
    if any(t.dtype != _F32 or t.device.type != "cpu" for t in tensors):
        return False
    slots = plan.slots.slots
    if slots.dtype != torch.int64 or slots.device.type != "cpu" or not slots.is_contiguous():
        return False
    if q.dim() != 3 or k.dim() != 3 or k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        return False
    tokens, dim = q.shape[0], q.shape[2]
    if dim % 2 or plan.half != dim // 2 or slots.shape != (tokens,) or any(t.stride(2) != 1 for t in (q, k, v)):
        return False
    for factor in (plan.cos, plan.sin):
        if factor.shape not in ((tokens, dim), (tokens, 1, dim)) or factor.stride(-1) != 1:
            return False
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride():
        return False
    return k_cache.shape[2:] == k.shape[1:] and k_cache.stride()[2:] == (dim, 1) \
        and k_cache.stride(0) == k_cache.shape[1] * k_cache.stride(1)


_BODIES = {
    cpu_bodies.rms_norm: lambda kernels: rms_norm_body(kernels.norm),
    cpu_bodies.add_rms_norm: lambda kernels: add_rms_norm_body(kernels.norm),
    cpu_bodies.silu_mul: lambda kernels: silu_mul_body(kernels.silu_mul),
    cpu_bodies.rotary_cache_write_planned: lambda kernels: rotary_body(kernels.rotary),
}


def bind_fused_kernels(graph: torch.fx.Graph, kernels: FusedKernels) -> int:
    """Points every call of `graph` to a body in `_BODIES` at its kernel's replacement (one per call,
    holding its checks), and every `plan_rotary` call that only rotary kernels read at
    `plan_rotary_kernel`; returns how many body calls."""
    count = 0
    for node in graph.nodes:
        replacement = _BODIES.get(node.target) if node.op == "call_function" else None
        if replacement is not None:
            node.target = replacement(kernels)
            count += 1
    for node in graph.nodes:
        if node.op == "call_function" and node.target is cpu_bodies.plan_rotary and node.users and all(
                getattr(user.target, "__name__", "") == "rotary_cache_write_kernel" for user in node.users):
            node.target = plan_rotary_kernel
    return count
