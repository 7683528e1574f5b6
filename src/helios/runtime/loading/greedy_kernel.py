"""A compiled CPU kernel for a greedy step's sampling (``--compile-programs``).

A compiled CPU program samples through `helios.abi.cpu_bodies.sample_rows_gathering` (or
`sample_rows`), whose greedy fast path (`helios.abi.sampling_cpu.greedy_tokens_cpu`) decides on
the host, in about ten numpy operations over the step's parameters and mask words, that no chosen
row draws, is penalised or is restricted by its grammar mask, then takes the argmax over the
logits, checks every row's maximum is finite and clears the unchosen rows: 22 us alone at 16 rows
and 1,024 tokens, 55 us inside a step.

`KERNEL_SOURCE` makes the same decision and the same argmax in one C++ call built at load through
Inductor's C++ toolchain (as `helios.runtime.loading.decode_attention_kernel`): a chosen row with
temperature > 0 (a NaN temperature is greedy, as there) or penalties other than (1, 0, 0) (a NaN
penalty is not neutral), or a chosen masked row whose mask words disallow some id < V, makes it
report that it did not decide; so does a row (chosen or not) whose maximum is not finite (NaN and
+inf propagate to the maximum, as in torch's max). Otherwise each row's token is the lowest id of
its maximum (torch's max on ties) and an unchosen row's is NO_TOKEN: the fast path's tokens bit
for bit. Where the kernel does not decide, the body it replaces runs and decides as before.

`greedy_sample(kernel, body)` is the sampling call's body in a compiled program (`body`: the
`cpu_bodies` function it replaces), `bind_greedy_sampling(graph, kernel)` points a program graph's
sampling calls at it. Thread ownership: the kernel is built at load; calls run on the model worker.
"""

from __future__ import annotations

from typing import Callable

import torch

from helios.abi import cpu_bodies
from helios.abi.grammar import MASK_WORD_BITS
from helios.abi.sampling_cpu import NO_TOKEN
from helios.runtime.loading.cpp_kernels import build_cpp_kernel, layouts

KERNEL_SOURCE = r"""
#include <torch/csrc/inductor/cpp_prefix.h>
#include <cmath>
#include <limits>

using Vec = at::vec::Vectorized<float>;

// Whether the row's mask words allow every id < vocab (bits past vocab are not looked at).
static bool allows_all(const int32_t* words, int64_t vocab) {
    const int64_t full = vocab / 32, rest = vocab % 32;
    for (int64_t w = 0; w < full; ++w)
        if (words[w] != -1) return false;
    if (rest == 0) return true;
    const int32_t valid = (int32_t)((1u << rest) - 1u);
    return (words[full] & valid) == valid;
}

// The lowest id of the row's maximum; false when the maximum is not finite (NaN propagates).
static bool row_argmax(const float* row, int64_t vocab, int64_t* token) {
    constexpr int64_t W = Vec::size();
    Vec top(-std::numeric_limits<float>::infinity());
    int64_t i = 0;
    for (; i + W <= vocab; i += W) top = at::vec::maximum(top, Vec::loadu(row + i));
    float most = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return at::vec::maximum(x, y); }, top);
    for (; i < vocab; ++i) most = std::isnan(row[i]) ? row[i] : (row[i] > most ? row[i] : most);
    if (!std::isfinite(most)) return false;
    const Vec target(most);
    for (i = 0; i + W <= vocab; i += W) {  // the first lane equal to the maximum
        const int other = Vec::loadu(row + i).eq(target).zero_mask();  // bit j: lane j differs
        const unsigned equal = ~static_cast<unsigned>(other) & ((W >= 32 ? 0u : (1u << W)) - 1u);
        if (equal) {
            *token = i + __builtin_ctz(equal);
            return true;
        }
    }
    for (; i < vocab; ++i)
        if (row[i] == most) break;
    *token = i;
    return true;
}

// status[0] = 0 and tokens set when the step is greedy (see the module docstring); 1 otherwise.
extern "C" void kernel(int64_t* tokens, int64_t* status, const float* logits, const float* temperature,
                       const float* penalties, const int32_t* words, const bool* mask_rows, const bool* rows,
                       int64_t count, int64_t vocab, int64_t logits_row, int64_t temperature_stride,
                       int64_t penalties_row, int64_t words_row, int64_t no_token) {
    status[0] = 1;
    for (int64_t r = 0; r < count; ++r) {
        if (!rows[r]) continue;
        const float* penalty = penalties + r * penalties_row;
        if (temperature[r * temperature_stride] > 0.f || penalty[0] != 1.f || penalty[1] != 0.f || penalty[2] != 0.f)
            return;
        if (mask_rows[r] && !allows_all(words + r * words_row, vocab)) return;
    }
    for (int64_t r = 0; r < count; ++r) {
        int64_t token = 0;
        if (!row_argmax(logits + r * logits_row, vocab, &token)) return;
        tokens[r] = rows[r] ? token : no_token;
    }
    status[0] = 0;
}
"""

_ARGUMENT_TYPES = ("int64_t*", "int64_t*", "const float*", "const float*", "const float*", "const int32_t*",
                   "const bool*", "const bool*", *("int64_t",) * 7)
_BODIES = {cpu_bodies.sample_rows_gathering: 14, cpu_bodies.sample_rows: 13}  # body: its argument count


def build_kernel() -> Callable:
    """The compiled kernel (`build_cpp_kernel`: once per process)."""
    return build_cpp_kernel(_ARGUMENT_TYPES, KERNEL_SOURCE)


def greedy_sample(kernel: Callable, body: Callable) -> Callable:
    """`body` (`sample_rows_gathering` or `sample_rows`, same arguments) with `kernel` deciding first
    where it takes the tensors; `body` decides what the kernel does not. The checks are made again
    only when a call's tensors differ in dtype, shape or strides from the last checked call's (a
    program's call site passes the same layouts every step)."""
    status = torch.zeros(1, dtype=torch.int64)
    state = status.numpy()  # a view: what the kernel last wrote
    last: list = [None, False]  # the tensors' signature, whether the kernel takes them

    def greedy_sample_kernel(*args) -> torch.Tensor:
        logits, temperature, penalties = args[0], args[3], args[7]
        grammar_mask, mask_rows, rows = args[-3], args[-2], args[-1]
        tensors = (logits, temperature, penalties, grammar_mask, mask_rows, rows)
        signature = layouts(*tensors)
        if signature != last[0]:
            last[:] = signature, kernel_applies(*tensors)
        if last[1]:
            tokens = torch.empty(logits.shape[0], dtype=torch.int64)
            kernel(tokens, status, logits, temperature, penalties, grammar_mask, mask_rows, rows, logits.shape[0],
                   logits.shape[1], logits.stride(0), temperature.stride(0), penalties.stride(0),
                   grammar_mask.stride(0), NO_TOKEN)
            if not state[0]:
                return tokens
        return body(*args)
    greedy_sample_kernel.body = body  # what it replaced (benchmarks swap it back)
    return greedy_sample_kernel


def kernel_applies(logits: torch.Tensor, temperature: torch.Tensor, penalties: torch.Tensor,
                   grammar_mask: torch.Tensor, mask_rows: torch.Tensor, rows: torch.Tensor) -> bool:
    """Whether the kernel reads these tensors: CPU, float32 logits [R, V], temperature [R] and
    penalties [R, 3], int32 mask words [R, ceil(V / 32)] (each row of the logits, penalties and
    words contiguous), bool mask_rows and rows [R], contiguous."""
    count = logits.shape[0] if logits.dim() == 2 else -1
    if count < 0 or logits.dtype != torch.float32 or logits.stride(1) != 1:
        return False
    expected = ((temperature, torch.float32, (count,)), (penalties, torch.float32, (count, 3)),
                (grammar_mask, torch.int32, (count, -(-logits.shape[1] // MASK_WORD_BITS))),
                (mask_rows, torch.bool, (count,)), (rows, torch.bool, (count,)))
    if not all(t.dtype == dtype and tuple(t.shape) == shape for t, dtype, shape in expected):
        return False
    if any(t.device.type != "cpu" for t in (logits, temperature, penalties, grammar_mask, mask_rows, rows)):
        return False
    return penalties.stride(1) == 1 and grammar_mask.stride(1) == 1 and mask_rows.is_contiguous() \
        and rows.is_contiguous()


def bind_greedy_sampling(graph: torch.fx.Graph, kernel: Callable) -> int:
    """Points every `sample_rows_gathering` and `sample_rows` call of `graph` at `greedy_sample`
    over it (one body per call); returns how many."""
    count = 0
    for node in graph.nodes:
        if node.op == "call_function" and _BODIES.get(node.target) == len(node.args) and not node.kwargs:
            node.target = greedy_sample(kernel, node.target)
            count += 1
    return count
