"""A C++ kernel for a CPU program's paged attention (`helios.runtime.loading.cpu_kernels`, and
``--compile-programs``).

The reference (`helios.abi.paged_reference`) gathers a decode step's pages into padded key and
value copies and runs ``scaled_dot_product_attention`` over them with an additive mask: at 16 rows,
4 query and 2 key/value heads of 32 and a 48-token context, about 50 us a call alone, of which
SDPA's flash kernel 30 us (its per-head small-GEMM calls and buffers) and the copies and views the
rest; a prompt chunk gathers its row's pages the same way.

`KERNEL_SOURCE` does the attention of every token of a step in one C++ call compiled at load
through Inductor's C++ toolchain: for each token and key/value head it walks its row's pages in
place (no gather; page ids clamped into the plane, as the plan clamps them), over the token's true
context only (positions ``first..p``, where ``first`` is 0, or ``p - window + 1`` with a window;
no padding, no mask), computes each query head's scores (query head ``h`` reads key/value head
``h // (Hq // Hkv)``), a max-subtracted softmax and the weighted sum of the values, vectorised
over the head dimension with ATen's ``Vectorized`` (group sizes 1-8 and 16 compiled in: each key
and value loaded once for the group's accumulators, held in registers; 22 to 12 us alone at the
embedded model's decode shapes). For groups of one or two query heads (the embedded model's two, the
4-layer study Llama's) the scores of up to 16 keys of a page (8 with AVX2) are reduced together
(`block_sums`: their sums transposed into one vector, about three shuffles and adds a key instead of
one reduction of eight each; every lane summed by the same tree, so a key's score does not depend on
the keys beside it), and the values are summed two or four vectors of the head at a time (independent
accumulator chains; each lane still adds its keys in order): 0.78-0.83x the previous kernel's time
at those models' decode shapes, 0.79-0.80x with heads of 64 and 128 (`bench/cpu_attention_ab.py`).
Larger groups share each key's loads among their heads and keep one reduction per key: blocked, they
measured up to 1.3x slower. Each token is computed on its own by the same code, so a token's
result is the same bits whichever step it runs in (a decode row, a prompt chunk of any length, a
speculative verification row, a recomputed history), as the reference's were: a program binds
the kernel at every attention call site or at none. While it attends a token it prefetches the
key and value lines of the next token of another row: after a step's matrix products the planes
are rarely in the CPU caches (measured in a 4-layer Llama step: 104 us for a layer's call, 44 us
repeated at once; 44 us with the prefetch). A token whose position is negative (nothing visible)
gets zeros, as SDPA gives a fully masked row; a padding token (outside the rows) gets zeros, as
the reference gives it. The same mathematics as the reference; float32 sums in another order, so
results equal it within float rounding.

`bind_decode_attention(graph, kernel)` points a program's planned attention calls at
`decode_attention(kernel)` and their shared `plan_attention` call at `plan_tokens`, which for
well-formed step inputs (an int32 page table, int64 positions, row bounds that never decrease,
every row's position inside the table) returns a `TokenStep` holding the step's tensors as they
are and each token's row: the kernel needs no page-id copy and no masks. Each attention call runs
the kernel for a `TokenStep` whose q and planes it takes (float32, contiguous q, row-major
key/value heads: a property of the call site, the same every step) and the reference `attend`
otherwise, over the `AttentionPlan` that `TokenStep.plan` builds once per step. With several
torch threads the kernel splits the tokens between them (OpenMP, as Inductor's kernels; one thread
when there are fewer than two tokens per thread).

Thread ownership: the kernel is built at load; calls run on the model worker.
"""

from __future__ import annotations

from typing import Callable

import numpy
import torch

from helios.abi import cpu_bodies
from helios.abi.paged_reference import AttentionPlan, attend, plan_attention
from helios.runtime.loading.cpp_kernels import build_cpp_kernel, layouts

KERNEL_SOURCE = r"""
#include <torch/csrc/inductor/cpp_prefix.h>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kMaxGroup = 32;  // query heads per key/value head (checked by the caller)

static inline float sum_lanes(Vec v) {
    return at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, v);
}
static inline float max_lanes(Vec v) {
    return at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return at::vec::maximum(x, y); }, v);
}

// Lane j of the result: the sum of v[j]'s lanes, for kBlock vectors at once (a transpose of the
// block folded into its sums: about three shuffles and adds a vector instead of eight). Every lane
// is summed by the same tree, so a key's score does not depend on which keys share its block.
#if defined(CPU_CAPABILITY_AVX512)
constexpr int64_t kBlock = 16;
__attribute__((always_inline)) static inline Vec block_sums(const Vec (&v)[kBlock]) {
    __m512 u[8], w[4], x[2];
    #pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
        const __m512 a = v[2 * i], b = v[2 * i + 1];
        u[i] = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    }
    #pragma GCC unroll 4
    for (int i = 0; i < 4; ++i)
        w[i] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * i], u[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(u[2 * i], u[2 * i + 1], 0xEE));
    #pragma GCC unroll 2
    for (int i = 0; i < 2; ++i)
        x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0xDD));
    return Vec(_mm512_add_ps(_mm512_shuffle_f32x4(x[0], x[1], 0x88), _mm512_shuffle_f32x4(x[0], x[1], 0xDD)));
}
#elif defined(CPU_CAPABILITY_AVX2)
constexpr int64_t kBlock = 8;
__attribute__((always_inline)) static inline Vec block_sums(const Vec (&v)[kBlock]) {
    __m256 u[4], w[2];
    #pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
        const __m256 a = v[2 * i], b = v[2 * i + 1];
        u[i] = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
    }
    #pragma GCC unroll 2
    for (int i = 0; i < 2; ++i)
        w[i] = _mm256_add_ps(_mm256_shuffle_ps(u[2 * i], u[2 * i + 1], 0x44),
                             _mm256_shuffle_ps(u[2 * i], u[2 * i + 1], 0xEE));
    return Vec(_mm256_add_ps(_mm256_permute2f128_ps(w[0], w[1], 0x20), _mm256_permute2f128_ps(w[0], w[1], 0x31)));
}
#else
constexpr int64_t kBlock = Vec::size();
static inline Vec block_sums(const Vec (&v)[kBlock]) {
    float sums[kBlock];
    for (int64_t j = 0; j < kBlock; ++j) sums[j] = sum_lanes(v[j]);
    return Vec::loadu(sums);
}
#endif

// scores[g * span + i] = scale * q_g . key(first + i) for the row's key/value head. G > 0: the
// group size at compile time (each key loaded once for the group's accumulators, in registers),
// else `group`.
template <int64_t G>
static void row_scores(float* __restrict__ scores, const float* __restrict__ qh, const float* __restrict__ plane,
                       const int64_t* __restrict__ ids, int64_t first, int64_t last, int64_t span, int64_t group,
                       int64_t head_dim, int64_t page_tokens, int64_t page_stride, int64_t token_stride, float scale) {
    constexpr int64_t W = Vec::size();
    if (G > 0) group = G;
    for (int64_t c = first; c <= last;) {
        const int64_t page = c / page_tokens, end = std::min(last + 1, (page + 1) * page_tokens);
        const float* key = plane + ids[page] * page_stride + (c - page * page_tokens) * token_stride;
        if constexpr (G == 0) {  // a group size not compiled in: one query head at a time
            for (; c < end; ++c, key += token_stride) {
                for (int64_t g = 0; g < group; ++g) {
                    const float* qg = qh + g * head_dim;
                    Vec acc(0.f);
                    int64_t d = 0;
                    for (; d + W <= head_dim; d += W) acc = at::vec::fmadd(Vec::loadu(qg + d), Vec::loadu(key + d), acc);
                    if (d < head_dim)
                        acc = at::vec::fmadd(Vec::loadu(qg + d, head_dim - d), Vec::loadu(key + d, head_dim - d), acc);
                    scores[g * span + (c - first)] = sum_lanes(acc) * scale;
                }
            }
            continue;
        }
        for (; c < end; ++c, key += token_stride) {
            Vec acc[G > 0 ? G : 1];
            for (int64_t g = 0; g < group; ++g) acc[g] = Vec(0.f);
            int64_t d = 0;
            for (; d + W <= head_dim; d += W) {
                const Vec k = Vec::loadu(key + d);
                for (int64_t g = 0; g < group; ++g) acc[g] = at::vec::fmadd(Vec::loadu(qh + g * head_dim + d), k, acc[g]);
            }
            if (d < head_dim) {
                const Vec k = Vec::loadu(key + d, head_dim - d);
                for (int64_t g = 0; g < group; ++g)
                    acc[g] = at::vec::fmadd(Vec::loadu(qh + g * head_dim + d, head_dim - d), k, acc[g]);
            }
            for (int64_t g = 0; g < group; ++g) scores[g * span + (c - first)] = sum_lanes(acc[g]) * scale;
        }
    }
}

// row_scores' scores for G of one or two, up to kBlock keys of one page at a time (their sums in one
// `block_sums`): the key loads it repeats per query head cost less than the reductions it saves.
template <int64_t G>
static void block_scores(float* __restrict__ scores, const float* __restrict__ qh, const float* __restrict__ plane,
                         const int64_t* __restrict__ ids, int64_t first, int64_t last, int64_t span,
                         int64_t head_dim, int64_t page_tokens, int64_t page_stride, int64_t token_stride,
                         float scale) {
    constexpr int64_t W = Vec::size();
    const Vec scaled(scale);
    for (int64_t c = first; c <= last;) {
        const int64_t page = c / page_tokens;
        const int64_t n = std::min({kBlock, last + 1 - c, (page + 1) * page_tokens - c});
        const float* base = plane + ids[page] * page_stride + (c - page * page_tokens) * token_stride;
        int64_t offset[kBlock];  // past the block's last key: that key again (its sums are not stored)
        #pragma GCC unroll 16
        for (int64_t j = 0; j < kBlock; ++j) offset[j] = std::min(j, n - 1) * token_stride;
        for (int64_t g = 0; g < G; ++g) {
            const float* qg = qh + g * head_dim;
            Vec acc[kBlock];
            #pragma GCC unroll 16
            for (int64_t j = 0; j < kBlock; ++j) acc[j] = Vec(0.f);
            int64_t d = 0;
            for (; d + W <= head_dim; d += W) {
                const Vec qd = Vec::loadu(qg + d);
                #pragma GCC unroll 16
                for (int64_t j = 0; j < kBlock; ++j) acc[j] = at::vec::fmadd(qd, Vec::loadu(base + offset[j] + d), acc[j]);
            }
            if (d < head_dim) {
                const Vec qd = Vec::loadu(qg + d, head_dim - d);
                #pragma GCC unroll 16
                for (int64_t j = 0; j < kBlock; ++j)
                    acc[j] = at::vec::fmadd(qd, Vec::loadu(base + offset[j] + d, head_dim - d), acc[j]);
            }
            const Vec s = block_sums(acc) * scaled;
            if (n == kBlock) s.store(scores + g * span + (c - first)); else s.store(scores + g * span + (c - first), n);
        }
        c += n;
    }
}

// Replaces scores by exp(score - max) and returns 1 / their sum.
static float softmax_terms(float* s, int64_t span) {
    constexpr int64_t W = Vec::size();
    Vec top(-std::numeric_limits<float>::infinity());
    int64_t i = 0;
    for (; i + W <= span; i += W) top = at::vec::maximum(top, Vec::loadu(s + i));
    float most = max_lanes(top);
    for (; i < span; ++i) most = std::max(most, s[i]);
    const Vec shift(most);
    Vec total(0.f);
    for (i = 0; i + W <= span; i += W) {
        const Vec e = (Vec::loadu(s + i) - shift).exp();
        e.store(s + i);
        total = total + e;
    }
    if (i < span) {
        const Vec e = (Vec::loadu(s + i, span - i) - shift).exp();
        e.store(s + i, span - i);
        total = total + Vec::set(Vec(0.f), e, span - i);
    }
    return 1.f / sum_lanes(total);
}

// out_g = inverse_g * sum_i scores[g * span + i] * value(first + i), W lanes of the head at a time.
// G as in row_scores.
template <int64_t G>
static void row_values(float* __restrict__ oh, const float* __restrict__ scores, const float* __restrict__ inverse,
                       const float* __restrict__ plane, const int64_t* __restrict__ ids, int64_t first, int64_t last,
                       int64_t span, int64_t group, int64_t head_dim, int64_t page_tokens, int64_t page_stride,
                       int64_t token_stride) {
    constexpr int64_t W = Vec::size();
    if (G > 0) group = G;
    for (int64_t d = 0; d < head_dim; d += W) {
        const int64_t width = std::min(W, head_dim - d);
        Vec acc[G > 0 ? G : kMaxGroup];
        for (int64_t g = 0; g < group; ++g) acc[g] = Vec(0.f);
        for (int64_t c = first; c <= last;) {
            const int64_t page = c / page_tokens, end = std::min(last + 1, (page + 1) * page_tokens);
            const float* value = plane + ids[page] * page_stride + (c - page * page_tokens) * token_stride + d;
            for (; c < end; ++c, value += token_stride) {
                const Vec v = width == W ? Vec::loadu(value) : Vec::loadu(value, width);
                for (int64_t g = 0; g < group; ++g)
                    acc[g] = at::vec::fmadd(Vec(scores[g * span + (c - first)]), v, acc[g]);
            }
        }
        for (int64_t g = 0; g < group; ++g) {
            const Vec o = acc[g] * Vec(inverse[g]);
            if (width == W) o.store(oh + g * head_dim + d); else o.store(oh + g * head_dim + d, width);
        }
    }
}

// acc[g][k] += scores[g * span + i] * value(first + i)[d + k * W ...] over the visible keys, for C
// vectors of the head at `d` (`width` lanes in the last one): G * C independent chains.
template <int64_t G, int64_t C>
static inline void value_pass(Vec (&acc)[G][C], const float* __restrict__ scores, const float* __restrict__ plane,
                              const int64_t* __restrict__ ids, int64_t first, int64_t last, int64_t span, int64_t d,
                              int64_t width, int64_t page_tokens, int64_t page_stride, int64_t token_stride) {
    constexpr int64_t W = Vec::size();
    #pragma GCC unroll 16
    for (int64_t g = 0; g < G; ++g)
        #pragma GCC unroll 4
        for (int64_t k = 0; k < C; ++k) acc[g][k] = Vec(0.f);
    for (int64_t c = first; c <= last;) {
        const int64_t page = c / page_tokens, end = std::min(last + 1, (page + 1) * page_tokens);
        const float* value = plane + ids[page] * page_stride + (c - page * page_tokens) * token_stride + d;
        for (; c < end; ++c, value += token_stride) {
            Vec v[C];
            #pragma GCC unroll 4
            for (int64_t k = 0; k < C; ++k)
                v[k] = k + 1 < C || width == W ? Vec::loadu(value + k * W) : Vec::loadu(value + k * W, width);
            #pragma GCC unroll 16
            for (int64_t g = 0; g < G; ++g) {
                const Vec s(scores[g * span + (c - first)]);
                #pragma GCC unroll 4
                for (int64_t k = 0; k < C; ++k) acc[g][k] = at::vec::fmadd(s, v[k], acc[g][k]);
            }
        }
    }
}

template <int64_t G, int64_t C>
static inline void store_pass(float* __restrict__ oh, const Vec (&acc)[G][C], const float* __restrict__ inverse,
                              int64_t head_dim, int64_t d, int64_t width) {
    constexpr int64_t W = Vec::size();
    for (int64_t g = 0; g < G; ++g)
        for (int64_t k = 0; k < C; ++k) {
            const Vec o = acc[g][k] * Vec(inverse[g]);
            if (k + 1 < C || width == W) o.store(oh + g * head_dim + d + k * W);
            else o.store(oh + g * head_dim + d + k * W, width);
        }
}

template <int64_t G, int64_t C>
static inline void full_pass(float* oh, const float* scores, const float* inverse, const float* plane,
                             const int64_t* ids, int64_t first, int64_t last, int64_t span, int64_t head_dim, int64_t d,
                             int64_t page_tokens, int64_t page_stride, int64_t token_stride) {
    Vec acc[G][C];
    value_pass<G, C>(acc, scores, plane, ids, first, last, span, d, Vec::size(), page_tokens, page_stride, token_stride);
    store_pass<G, C>(oh, acc, inverse, head_dim, d, Vec::size());
}

// row_values' output for G of one or two: two or four vectors of the head per pass (G * C independent
// accumulator chains; each lane still sums its keys in order, so the bits are row_values').
template <int64_t G>
static void paired_values(float* __restrict__ oh, const float* __restrict__ scores, const float* __restrict__ inverse,
                          const float* __restrict__ plane, const int64_t* __restrict__ ids, int64_t first, int64_t last,
                          int64_t span, int64_t head_dim, int64_t page_tokens, int64_t page_stride,
                          int64_t token_stride) {
    constexpr int64_t W = Vec::size();
    int64_t d = 0;
    for (; d + 4 * W <= head_dim; d += 4 * W)
        full_pass<G, 4>(oh, scores, inverse, plane, ids, first, last, span, head_dim, d, page_tokens, page_stride,
                        token_stride);
    for (; d + 2 * W <= head_dim; d += 2 * W)
        full_pass<G, 2>(oh, scores, inverse, plane, ids, first, last, span, head_dim, d, page_tokens, page_stride,
                        token_stride);
    for (; d < head_dim; d += W) {  // the rest, a vector at a time
        Vec acc[G][1];
        const int64_t width = std::min(W, head_dim - d);
        value_pass<G, 1>(acc, scores, plane, ids, first, last, span, d, width, page_tokens, page_stride, token_stride);
        store_pass<G, 1>(oh, acc, inverse, head_dim, d, width);
    }
}

// Both passes of one row and key/value head, with the group size fixed at compile time where it is
// a common one.
template <int64_t G>
static void attend_head(float* oh, float* scores, float* inverse, const float* qh, const float* k_plane,
                        const float* v_plane, const int64_t* ids, int64_t first, int64_t last, int64_t span,
                        int64_t group, int64_t head_dim, int64_t page_tokens, int64_t page_stride,
                        int64_t token_stride, float scale) {
    if constexpr (G == 1 || G == 2) {
        block_scores<G>(scores, qh, k_plane, ids, first, last, span, head_dim, page_tokens, page_stride, token_stride,
                        scale);
        for (int64_t g = 0; g < G; ++g) inverse[g] = softmax_terms(scores + g * span, span);
        paired_values<G>(oh, scores, inverse, v_plane, ids, first, last, span, head_dim, page_tokens, page_stride,
                         token_stride);
    } else {
        row_scores<G>(scores, qh, k_plane, ids, first, last, span, group, head_dim, page_tokens, page_stride,
                      token_stride, scale);
        for (int64_t g = 0; g < group; ++g) inverse[g] = softmax_terms(scores + g * span, span);
        row_values<G>(oh, scores, inverse, v_plane, ids, first, last, span, group, head_dim, page_tokens, page_stride,
                      token_stride);
    }
}

// One row's attention for one key/value head (its query heads h * group .. h * group + group - 1).
static void row_head(float* out, const float* q, const float* k_plane, const float* v_plane, const int64_t* ids,
                     int64_t last, int64_t h, std::vector<float>& scores, int64_t q_heads, int64_t group,
                     int64_t head_dim, int64_t page_tokens, int64_t page_stride, int64_t token_stride, int64_t window,
                     float scale) {
    const int64_t first = window > 0 ? std::max<int64_t>(0, last - window + 1) : 0;
    const int64_t span = last - first + 1;
    float* oh = out + h * group * head_dim;
    if (span <= 0) {  // nothing visible: zeros, as SDPA gives a fully masked row
        std::fill(oh, oh + group * head_dim, 0.f);
        return;
    }
    if ((int64_t)scores.size() < group * span) scores.resize(group * span);
    float inverse[kMaxGroup];
    const float* qh = q + h * group * head_dim;
    const float* kh = k_plane + h * head_dim;
    const float* vh = v_plane + h * head_dim;
    switch (group) {
#define HELIOS_GROUP(G) case G: attend_head<G>(oh, scores.data(), inverse, qh, kh, vh, ids, first, last, span, \
                                               group, head_dim, page_tokens, page_stride, token_stride, scale); break;
        HELIOS_GROUP(1) HELIOS_GROUP(2) HELIOS_GROUP(3) HELIOS_GROUP(4) HELIOS_GROUP(5) HELIOS_GROUP(6)
        HELIOS_GROUP(7) HELIOS_GROUP(8) HELIOS_GROUP(16)
#undef HELIOS_GROUP
        default: attend_head<0>(oh, scores.data(), inverse, qh, kh, vh, ids, first, last, span, group, head_dim,
                                page_tokens, page_stride, token_stride, scale);
    }
}

// The row's page ids clamped into the plane (an entry past the row's last page may hold anything).
static void clamp_pages(std::vector<int64_t>& ids, const int32_t* table, int64_t last, int64_t page_tokens,
                        int64_t plane_pages) {
    const int64_t count = last < 0 ? 0 : last / page_tokens + 1;
    ids.resize(count);
    for (int64_t j = 0; j < count; ++j) ids[j] = std::min<int64_t>(std::max<int64_t>(table[j], 0), plane_pages - 1);
}

// Asks for the lines of a token's visible keys and values (every head) ahead of their use: after a
// step's matrix products the cache planes are rarely in the CPU caches, and a row's pages are
// scattered, so the hardware prefetchers do not see them coming. `ids`: scratch for the page ids.
static void prefetch_row(const float* k_plane, const float* v_plane, const int32_t* table, int64_t last,
                         int64_t page_tokens, int64_t page_stride, int64_t token_stride, int64_t window,
                         int64_t plane_pages, std::vector<int64_t>& ids) {
    clamp_pages(ids, table, last, page_tokens, plane_pages);
    const int64_t first = window > 0 ? std::max<int64_t>(0, last - window + 1) : 0;
    constexpr int64_t kLine = 64 / sizeof(float);
    for (int64_t c = first; c <= last;) {
        const int64_t page = c / page_tokens, end = std::min(last + 1, (page + 1) * page_tokens);
        const int64_t offset = ids[page] * page_stride + (c - page * page_tokens) * token_stride;
        const int64_t extent = (end - c) * token_stride;
        for (int64_t i = 0; i < extent; i += kLine) {
            __builtin_prefetch(k_plane + offset + i, 0, 3);
            __builtin_prefetch(v_plane + offset + i, 0, 3);
        }
        c = end;
    }
}

// Token t attends as the token at position positions[t] of row token_rows[t] (-1: a padding token,
// zeros), over that row's page-table row: each token on its own, so a token's result never depends on
// the other tokens of the step. A token whose next token is of another row asks for that row's lines.
extern "C" void kernel(float* out, const float* q, const float* k_plane, const float* v_plane,
                       const int32_t* table, const int64_t* positions, const int64_t* token_rows, int64_t tokens,
                       int64_t table_pages, int64_t q_heads, int64_t kv_heads, int64_t head_dim, int64_t page_tokens,
                       int64_t page_stride, int64_t token_stride, int64_t window, float scale, int64_t plane_pages,
                       int64_t threads) {
    const int64_t group = q_heads / kv_heads;
    #pragma omp parallel num_threads(threads) if(threads > 1 && tokens >= 2 * threads)
    {
        std::vector<float> scores;
        std::vector<int64_t> ids, next;
        bool fetched = false;  // whether this thread asked for its first token's lines
        #pragma omp for schedule(static)
        for (int64_t t = 0; t < tokens; ++t) {
            const int64_t row = token_rows[t];
            float* ot = out + t * q_heads * head_dim;
            if (row < 0) {  // a padding token: zeros
                std::fill(ot, ot + q_heads * head_dim, 0.f);
                continue;
            }
            if (!fetched) {
                prefetch_row(k_plane, v_plane, table + row * table_pages, positions[t], page_tokens, page_stride,
                             token_stride, window, plane_pages, next);
                fetched = true;
            }
            clamp_pages(ids, table + row * table_pages, positions[t], page_tokens, plane_pages);
            if (t + 1 < tokens && token_rows[t + 1] >= 0 && token_rows[t + 1] != row)
                prefetch_row(k_plane, v_plane, table + token_rows[t + 1] * table_pages, positions[t + 1], page_tokens,
                             page_stride, token_stride, window, plane_pages, next);
            for (int64_t h = 0; h < kv_heads; ++h)
                row_head(ot, q + t * q_heads * head_dim, k_plane, v_plane, ids.data(), positions[t], h, scores,
                         q_heads, group, head_dim, page_tokens, page_stride, token_stride, window, scale);
        }
    }
}
"""

_ARGUMENT_TYPES = ("float*", "const float*", "const float*", "const float*", "const int32_t*", "const int64_t*",
                   "const int64_t*", *("int64_t",) * 9, "float", "int64_t", "int64_t")
MAX_GROUP = 32  # kMaxGroup above
def build_kernel() -> Callable:
    """The compiled kernel (`build_cpp_kernel`: once per process)."""
    return build_cpp_kernel(_ARGUMENT_TYPES, KERNEL_SOURCE)


class TokenStep:
    """What a step's attention calls share in place of an `AttentionPlan` (the plan the reference
    needs is built from it on first use, for a call the kernel does not compute): the step's int32
    page table and int64 positions as given, each token's row (int64 [T], -1 for a padding token),
    the window and the plane geometry."""

    __slots__ = ("page_table", "query_start", "positions", "token_rows", "window", "k_cache", "_plan")

    def __init__(self, page_table, query_start, positions, token_rows, window: int, k_cache) -> None:
        self.page_table, self.query_start, self.positions = page_table, query_start, positions
        self.token_rows, self.window, self.k_cache, self._plan = token_rows, window, k_cache, None

    def plan(self) -> AttentionPlan:
        if self._plan is None:
            self._plan = plan_attention(self.page_table, self.query_start, self.positions, self.window, self.k_cache)
        return self._plan


def plan_tokens(page_table: torch.Tensor, query_start: torch.Tensor, positions: torch.Tensor, window: int,
                k_cache: torch.Tensor) -> TokenStep | AttentionPlan:
    """`plan_attention`'s replacement in a program with the kernel: a `TokenStep` on the CPU with a
    contiguous int32 page table of one row per row bound, int64 positions and int32 or int64 row
    bounds that never decrease, every row's token inside the table; `plan_attention` otherwise
    (which raises for a position past the table). About 6 us a step (the layouts' checks made
    once per layout, a full decode step's rows shared)."""
    signature = layouts(page_table, query_start, positions)
    fits = _STEP_LAYOUTS.get(signature)
    if fits is None:
        fits = _STEP_LAYOUTS[signature] = _step_fits(page_table, query_start, positions)
    if not fits:
        return plan_attention(page_table, query_start, positions, window, k_cache)
    bounds, tokens = query_start.numpy(), positions.shape[0]
    counts = bounds[1:] - bounds[:-1]
    first, last = int(bounds[0]), int(bounds[-1])
    if first < 0 or last > tokens or counts.min() < 0:
        return plan_attention(page_table, query_start, positions, window, k_cache)
    rows = page_table.shape[0]
    if first == 0 and last == tokens == rows:  # a full decode step: row r owns token r
        token_rows = _decode_rows(rows)
    else:
        chosen = numpy.full(tokens, -1, dtype=numpy.int64)
        chosen[first:last] = numpy.arange(rows, dtype=numpy.int64).repeat(counts)
        token_rows = torch.from_numpy(chosen)
    if last > first and int(positions.numpy()[first:last].max()) >= page_table.shape[1] * k_cache.shape[1]:
        return plan_attention(page_table, query_start, positions, window, k_cache)
    return TokenStep(page_table, query_start, positions, token_rows, window, k_cache)


_STEP_LAYOUTS: dict[tuple, bool] = {}
_DECODE_ROWS: dict[int, torch.Tensor] = {}


def _step_fits(page_table: torch.Tensor, query_start: torch.Tensor, positions: torch.Tensor) -> bool:
    rows = page_table.shape[0]
    return (page_table.dtype == torch.int32 and positions.dtype == torch.int64 and page_table.is_cpu
            and positions.is_cpu and query_start.is_cpu and page_table.is_contiguous() and positions.is_contiguous()
            and query_start.dtype in (torch.int32, torch.int64) and query_start.shape == (rows + 1,)
            and query_start.is_contiguous() and rows > 0)


def _decode_rows(rows: int) -> torch.Tensor:
    """0..rows - 1 (int64), made once per row count (the kernel only reads it)."""
    made = _DECODE_ROWS.get(rows)
    if made is None:
        made = _DECODE_ROWS[rows] = torch.arange(rows, dtype=torch.int64)
    return made


def decode_attention(kernel: Callable) -> Callable:
    """`attention_planned` (q, k_cache, v_cache, plan, scale) for a `TokenStep` or an
    `AttentionPlan`: through `kernel` where it applies (see the module docstring), the reference
    `attend` elsewhere. The checks are made again only when a call's tensors differ in dtype,
    device, shape or strides from the last checked call's (`layouts`: a program's call site passes
    the same layouts every step)."""
    last: list = [None, None]  # the layouts' signature, the kernel's geometry arguments (None: it does not apply)

    def decode_attention_kernel(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                plan: TokenStep | AttentionPlan, scale: float) -> torch.Tensor:
        if type(plan) is not TokenStep:
            return attend(plan, q, k_cache, v_cache, scale)
        signature = layouts(q, k_cache, v_cache)
        if signature != last[0]:  # (an eager program's planes are new views of the layer's buffer every step)
            fits = planes_fit(k_cache, v_cache) and query_fits(q, k_cache)
            last[:] = signature, ((q.shape[1], k_cache.shape[2], q.shape[2], k_cache.shape[1], k_cache.stride(0),
                                   k_cache.stride(1)) if fits else None)
        tokens = q.shape[0]
        if last[1] is None or tokens != plan.positions.shape[0]:
            return attend(plan.plan(), q, k_cache, v_cache, scale)
        out = torch.empty(q.shape, dtype=torch.float32)
        kernel(out, q, k_cache, v_cache, plan.page_table, plan.positions, plan.token_rows, tokens,
               plan.page_table.shape[1], *last[1], plan.window, float(scale), k_cache.shape[0], torch.get_num_threads())
        return out
    return decode_attention_kernel


def planes_fit(k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether the kernel reads these planes: float32 CPU [pages, page tokens, Hkv, D], row-major
    heads, both of one shape and layout."""
    if k_cache.dtype != torch.float32 or v_cache.dtype != torch.float32 or k_cache.dim() != 4:
        return False
    if k_cache.device.type != "cpu" or v_cache.device.type != "cpu" or k_cache.shape != v_cache.shape:
        return False
    return k_cache.stride() == v_cache.stride() and k_cache.stride()[2:] == (k_cache.shape[3], 1)


def query_fits(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether the kernel takes this q: float32 CPU, contiguous [rows, Hq, D] with Hq a multiple of
    the planes' Hkv (at most `MAX_GROUP` query heads per key/value head)."""
    if q.dtype != torch.float32 or q.device.type != "cpu" or q.dim() != 3 or not q.is_contiguous():
        return False
    kv_heads = k_cache.shape[2]
    return q.shape[2] == k_cache.shape[3] and kv_heads > 0 and q.shape[1] % kv_heads == 0 \
        and q.shape[1] // kv_heads <= MAX_GROUP


def bind_decode_attention(graph: torch.fx.Graph, kernel: Callable) -> int:
    """Points every `attention_planned` call of `graph` at `decode_attention(kernel)` (one body per
    call, holding its planes' checks), and every `plan_attention` call that only such calls read at
    `plan_tokens`; returns how many attention calls."""
    count = 0
    for node in graph.nodes:
        if node.op == "call_function" and node.target is cpu_bodies.attention_planned:
            node.target = decode_attention(kernel)
            count += 1
    for node in graph.nodes:
        if node.op == "call_function" and node.target is plan_attention and node.users and all(
                getattr(user.target, "__name__", "") == "decode_attention_kernel" for user in node.users):
            node.target = plan_tokens
    return count
