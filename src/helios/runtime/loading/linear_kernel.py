"""A C++ kernel for a CPU program's projections, over weights packed at load.

A CPU program's projections run ``aten.linear``: MKL's sgemm on the [out, in] weight, which at a
decode step's row counts repacks the weight for every call and reaches a fraction of the core's
arithmetic (measured on this project's 2-core machine, float32, one thread: 16 x 256 -> 1,024 at
56-73 GFLOP/s with the weight in cache, and a 4-layer model's 16 projections in 1.9-2.6 ms a step
as they stream from L3). `SOURCE` computes ``x @ W.T + bias`` over a copy of the weight packed
once, at load, into column blocks (`pack`: [ceil(out / 32), in, 32], zero-padded), the layout its
inner loop streams: 8 rows of x times 32 outputs held in 16 of AVX-512's vector registers (6
rows times 16 outputs in 12 of AVX2's), one broadcast multiply-add per row and vector for each
input feature (100-110 GFLOP/s there, the 16 projections in 0.9 ms). Rows split into chunks of 64,
and over threads by (chunk, block) when a call has `PARALLEL_MACS` multiply-adds or more and
torch's intra-op threads are more than one.

Each output is one fused multiply-add chain over the input features in order, plus the bias:
the same bits whatever the call's row count, the row's place in it or the thread count (the
tests check it), so a token's projections do not depend on the step it runs in; they equal
MKL's within float rounding (another order of the same sums).

`linear_body(kernel, weight, packed)` is the replacement of a call site's ``linear(x, W, b)``: the
kernel where it takes the tensors (float32 CPU, x's rows at one stride with unit feature stride,
`weight` the very tensor packed, a contiguous float32 bias), torch's linear otherwise.
`bind_linears(graph, kernel, weights, packs)` points a program's fast graph at it for every
projection whose weight is one of the program's weights (`PackedWeights`: one packed copy per
weight for all programs of a load, within a memory budget).

Thread ownership: built and packed at load; calls run on the model worker.
"""

from __future__ import annotations

import logging
from typing import Callable, Sequence

import torch

from helios.runtime.loading.cpp_kernels import build_cpp_kernel, layouts
from helios.runtime.loading.memory_budget import available_nbytes
from helios.runtime.loading.packed_linears import LINEARS

_LOG = logging.getLogger(__name__)
_F32 = torch.float32
BLOCK = 32  # outputs per packed column block (two 16-float vectors)
PARALLEL_MACS = 1 << 16  # a call this large (rows x out x in) splits over threads
MEMORY_SHARE = 0.5  # packed copies may take at most this share of the memory available at load

SOURCE = r"""
#include <torch/csrc/inductor/cpp_prefix.h>
#include <algorithm>

using Vec = at::vec::Vectorized<float>;
constexpr int64_t W = Vec::size();
constexpr int64_t NB = 32;     // outputs per packed block
constexpr int64_t CHUNK = 64;  // rows per work item
static_assert(NB % W == 0, "a block is whole vectors");
constexpr int V = NB / W;               // vectors a block holds per row
constexpr int VT = V < 2 ? V : 2;       // vectors a tile holds per row (a block is V / VT tiles wide)
constexpr int MR = W >= 16 ? 8 : 6;     // rows of a full tile: MR x VT accumulators, VT weights and a
                                        // broadcast in 16 vector registers (AVX2) or 32 (AVX-512)
static_assert(V % VT == 0, "a block is whole tiles");

// R rows (from m0) times VT vectors of outputs (from c0, columns of the packed panel p):
// acc[i][v] += x[m0 + i, k] * p[k, v], k in order. The loops over i and v unroll so that the
// accumulators stay in registers.
template <int R>
static inline void tile(float* out, const float* x, const float* p, const float* bias, int64_t m0, int64_t c0,
                        int64_t K, int64_t N, int64_t x_row) {
    Vec acc[R][VT];
    const float* xr[R];
    _Pragma("GCC unroll 16") for (int i = 0; i < R; ++i) {
        xr[i] = x + (m0 + i) * x_row;
        _Pragma("GCC unroll 4") for (int v = 0; v < VT; ++v) acc[i][v] = Vec(0.f);
    }
    for (int64_t k = 0; k < K; ++k) {
        Vec w[VT];
        _Pragma("GCC unroll 4") for (int v = 0; v < VT; ++v) w[v] = Vec::loadu(p + k * NB + v * W);
        _Pragma("GCC unroll 16") for (int i = 0; i < R; ++i) {
            const Vec xv(xr[i][k]);
            _Pragma("GCC unroll 4") for (int v = 0; v < VT; ++v) acc[i][v] = at::vec::fmadd(xv, w[v], acc[i][v]);
        }
    }
    const int64_t left = std::min<int64_t>(VT * W, N - c0);
    if (left == VT * W) {
        _Pragma("GCC unroll 16") for (int i = 0; i < R; ++i) {
            float* o = out + (m0 + i) * N + c0;
            _Pragma("GCC unroll 4") for (int v = 0; v < VT; ++v) {
                if (bias) (acc[i][v] + Vec::loadu(bias + c0 + v * W)).store(o + v * W);
                else acc[i][v].store(o + v * W);
            }
        }
        return;
    }
    float tmp[R][VT * W];  // the last, partial tile: through memory
    _Pragma("GCC unroll 16") for (int i = 0; i < R; ++i) {
        _Pragma("GCC unroll 4") for (int v = 0; v < VT; ++v) acc[i][v].store(tmp[i] + v * W);
    }
    for (int i = 0; i < R; ++i) {
        float* o = out + (m0 + i) * N + c0;
        for (int64_t j = 0; j < left; ++j) o[j] = bias ? tmp[i][j] + bias[c0 + j] : tmp[i][j];
    }
}

static void rows_by_block(float* out, const float* x, const float* packed, const float* bias, int64_t m_begin,
                          int64_t m_end, int64_t b, int64_t K, int64_t N, int64_t x_row) {
    for (int s = 0; s < V / VT; ++s) {
        const float* p = packed + b * K * NB + s * VT * W;
        const int64_t c0 = b * NB + s * VT * W;
        if (c0 >= N) return;
        int64_t m = m_begin;
        for (; m + MR <= m_end; m += MR) tile<MR>(out, x, p, bias, m, c0, K, N, x_row);
        if (m + 4 <= m_end) { tile<4>(out, x, p, bias, m, c0, K, N, x_row); m += 4; }
        if (m + 2 <= m_end) { tile<2>(out, x, p, bias, m, c0, K, N, x_row); m += 2; }
        if (m < m_end) tile<1>(out, x, p, bias, m, c0, K, N, x_row);
    }
}

// out [rows, N] = x [rows, K] (rows x_row floats apart) @ W.T (+ bias), W packed as [ceil(N / NB), K, NB].
extern "C" void kernel(float* out, const float* x, const float* packed, const float* bias, int64_t rows,
                       int64_t K, int64_t N, int64_t x_row, int64_t has_bias, int64_t threads) {
    const int64_t blocks = (N + NB - 1) / NB;
    const float* b = has_bias ? bias : nullptr;
    #pragma omp parallel for collapse(2) schedule(static) num_threads(threads) if(threads > 1)
    for (int64_t m = 0; m < rows; m += CHUNK)
        for (int64_t nb = 0; nb < blocks; ++nb)
            rows_by_block(out, x, packed, b, m, std::min(rows, m + CHUNK), nb, K, N, x_row);
}
"""

_ARGUMENT_TYPES = ("float*", "const float*", "const float*", "const float*", "int64_t", "int64_t", "int64_t",
                   "int64_t", "int64_t", "int64_t")


def build_kernel() -> Callable:
    """The compiled kernel (`build_cpp_kernel`: once per process)."""
    return build_cpp_kernel(_ARGUMENT_TYPES, SOURCE)


def packable(weight: torch.Tensor) -> bool:
    """A float32 CPU [out, in] weight with at least one of each."""
    return (weight.dtype == _F32 and weight.device.type == "cpu" and weight.dim() == 2 and weight.shape[0] > 0
            and weight.shape[1] > 0)


def _blocks(out_features: int) -> int:
    return -(-out_features // BLOCK)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """`weight` [out, in] as the kernel reads it: [ceil(out / BLOCK), in, BLOCK], the outputs past
    `out` zero."""
    out, inner = weight.shape
    full, rest = divmod(out, BLOCK)
    packed = torch.empty(_blocks(out), inner, BLOCK, dtype=_F32)
    if full:
        packed[:full].copy_(weight[:full * BLOCK].reshape(full, BLOCK, inner).transpose(1, 2))
    if rest:
        packed[full].zero_()
        packed[full, :, :rest].copy_(weight[full * BLOCK:].T)
    return packed


class PackedWeights:
    """The packed copies of one load's projection weights, made once each (keyed by the weight's
    memory and layout), until they would take more than `budget` bytes; past it, `get` returns None
    (the projection keeps torch's linear) and logs it once."""

    def __init__(self, budget: int):
        self.budget = budget
        self.bytes = 0
        self._packed: dict[tuple, torch.Tensor] = {}
        self._over = False

    @classmethod
    def for_this_machine(cls) -> PackedWeights:
        """A budget of `MEMORY_SHARE` of the memory available now (MemAvailable; everything, where
        unknown)."""
        available = available_nbytes(torch.device("cpu"))
        return cls(budget=1 << 62 if available is None else int(available * MEMORY_SHARE))

    def get(self, weight: torch.Tensor) -> torch.Tensor | None:
        key = (weight.data_ptr(), weight.shape, weight.stride())
        packed = self._packed.get(key)
        if packed is not None:
            return packed
        size = _blocks(weight.shape[0]) * BLOCK * weight.shape[1] * _F32.itemsize
        if self.bytes + size > self.budget:
            if not self._over:
                _LOG.info("packed projection weights would pass %d bytes (a share of the memory available): "
                          "the remaining projections run through torch's linear", self.budget)
                self._over = True
            return None
        self.bytes += size
        packed = self._packed[key] = pack(weight)
        return packed

    @property
    def count(self) -> int:
        """How many weights are packed."""
        return len(self._packed)


def linear_body(kernel: Callable, weight: torch.Tensor, packed: torch.Tensor) -> Callable:
    """``linear(x, W, bias)`` through the kernel for `weight` (packed as `packed`), where the call
    passes that very weight and the kernel takes x and the bias (`_linear_arguments`); torch's
    linear otherwise."""
    address, out_features, in_features = weight.data_ptr(), weight.shape[0], weight.shape[1]
    last: list = [None, None]  # the layout signature, the kernel's row count and row stride (None: torch's)
    linear = torch._C._nn.linear

    def packed_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if w is not weight and (w.data_ptr() != address or w.shape != weight.shape or w.stride() != weight.stride()):
            return linear(x, w, bias)  # (a program is called with the same weight tensors every step)
        signature = layouts(x) if bias is None else layouts(x, bias)
        if signature != last[0]:
            last[:] = signature, _linear_arguments(x, bias, out_features, in_features)
        if last[1] is None:
            return linear(x, w, bias)
        rows, row_stride = last[1]
        out = torch.empty((*x.shape[:-1], out_features), dtype=_F32)
        threads = torch.get_num_threads() if rows * out_features * in_features >= PARALLEL_MACS else 1
        kernel(out, x, packed, packed if bias is None else bias, rows, in_features, out_features, row_stride,
               int(bias is not None), threads)
        return out
    return packed_linear


def _linear_arguments(x: torch.Tensor, bias: torch.Tensor | None, out_features: int,
                      in_features: int) -> tuple[int, int] | None:
    """(rows, row stride) of x for the kernel, or None where it does not take the call: float32 CPU
    x of two or more dimensions, `in_features` wide with unit stride, its leading dimensions one run
    of rows at one stride; a contiguous float32 CPU bias of `out_features`, or none."""
    if x.dtype != _F32 or x.device.type != "cpu" or x.dim() < 2 or x.shape[-1] != in_features or x.stride(-1) != 1:
        return None
    if bias is not None and (bias.dtype != _F32 or bias.device.type != "cpu" or bias.shape != (out_features,)
                             or bias.stride() != (1,)):
        return None
    rows, stride = 1, x.stride(-2)
    for dim in range(x.dim() - 2, -1, -1):
        if x.shape[dim] != 1 and x.stride(dim) != rows * stride:
            return None
        rows *= x.shape[dim]
    return rows, stride


def bind_linears(graph: torch.fx.Graph, kernel: Callable, weights: Sequence[torch.Tensor],
                 packs: PackedWeights) -> int:
    """Points every ``linear(x, W, b)`` of `graph` whose W is one of the program's weights (its
    placeholder among the first ``len(weights)``) and `packable` at `linear_body`; returns how many."""
    placeholders = [node for node in graph.nodes if node.op == "placeholder"][:len(weights)]
    weight_of = dict(zip(placeholders, weights))
    count = 0
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in LINEARS or len(node.args) < 2 or node.kwargs:
            continue
        weight = weight_of.get(node.args[1])
        if weight is None or not packable(weight):
            continue
        packed = packs.get(weight)
        if packed is None:
            continue
        node.target = linear_body(kernel, weight, packed)
        count += 1
    return count
