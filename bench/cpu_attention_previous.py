"""The CPU attention kernel before its blocked scores and paired value passes (for
`bench/cpu_attention_ab.py`): `helios.runtime.loading.decode_attention_kernel`'s C++ source as it was,
built with the same argument list. Each key's score was reduced on its own (eight shuffles and adds
a dot product) and the values summed one vector of the head at a time."""

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

// Both passes of one row and key/value head, with the group size fixed at compile time where it is
// a common one.
template <int64_t G>
static void attend_head(float* oh, float* scores, float* inverse, const float* qh, const float* k_plane,
                        const float* v_plane, const int64_t* ids, int64_t first, int64_t last, int64_t span,
                        int64_t group, int64_t head_dim, int64_t page_tokens, int64_t page_stride,
                        int64_t token_stride, float scale) {
    row_scores<G>(scores, qh, k_plane, ids, first, last, span, group, head_dim, page_tokens, page_stride,
                  token_stride, scale);
    for (int64_t g = 0; g < group; ++g) inverse[g] = softmax_terms(scores + g * span, span);
    row_values<G>(oh, scores, inverse, v_plane, ids, first, last, span, group, head_dim, page_tokens, page_stride,
                  token_stride);
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
