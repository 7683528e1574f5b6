"""Online-softmax steps of the prefill kernel (`helios.abi.triton_prefill`) shared by its key/value
paths, and its contiguous-run path: where the pages of a block's unmasked range are consecutive in
the cache (pages handed out in order to a fresh prompt), its key and value tiles are read as one
``[BLOCK_N, HEAD_DIM]`` block each through tensor descriptors (TMA on Hopper) instead of gathered
row by row through the page table. The check runs on the device, per program, so a captured graph
takes whichever path each step's page table allows.
"""

from __future__ import annotations

import triton
import triton.language as tl

from helios.abi.triton_paged import capped_scores

__all__ = ["attend_contiguous", "consecutive_pages", "softmax_step"]


@triton.jit
def softmax_step(q, k, v, acc, m_i, l_i, scale_log2, DOT_PRECISION: tl.constexpr, SOFTCAP: tl.constexpr):
    """One unmasked online-softmax step of q against the key and value tiles k, v ([BLOCK_N, D]);
    SOFTCAP > 0: the scores capped first (`capped_scores`)."""
    scores, factor = capped_scores(tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION), scale_log2, SOFTCAP)
    m_new = tl.maximum(m_i, tl.max(scores, 1) * factor)
    probs = tl.exp2(scores * factor - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(probs, 1)
    acc = tl.dot(probs.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)  # accumulates in place
    return acc, m_new, l_i


@triton.jit
def consecutive_pages(page_table_ptr, row_pages, lo, hi, BLOCK: tl.constexpr, PAGE_TOKENS: tl.constexpr):
    """(whether the table's pages of positions [lo, hi) are consecutive cache pages, the cache row of
    position 0 were they so): the pages are read BLOCK entries at a time. An empty range is not."""
    first_index = lo // PAGE_TOKENS
    last_index = (hi - 1) // PAGE_TOKENS
    first = tl.load(page_table_ptr + row_pages + first_index, mask=hi > lo, other=0).to(tl.int32)
    bad = tl.program_id(0) * 0
    for chunk in range(first_index, last_index + 1, BLOCK):
        index = chunk + tl.arange(0, BLOCK)
        inside = index <= last_index
        pages = tl.load(page_table_ptr + row_pages + index, mask=inside, other=0).to(tl.int32)
        bad += tl.sum((inside & (pages != first + index - first_index)).to(tl.int32))
    return (bad == 0) & (hi > lo), (first - first_index) * PAGE_TOKENS


@triton.jit
def attend_contiguous(q, acc, m_i, l_i, k_desc, v_desc, row0, column, lo, hi, scale_log2, BLOCK_N: tl.constexpr,
                      DOT_PRECISION: tl.constexpr, SOFTCAP: tl.constexpr):
    """The unmasked tiles [lo, hi) (whole BLOCK_N tiles) of a block whose positions p sit at cache row
    ``row0 + p`` of the descriptors' [pages x page tokens, key/value heads x D] view, head columns
    from `column`."""
    for start in range(lo, hi, BLOCK_N):
        k = k_desc.load([row0 + start, column])
        v = v_desc.load([row0 + start, column])
        acc, m_i, l_i = softmax_step(q, k, v, acc, m_i, l_i, scale_log2, DOT_PRECISION, SOFTCAP)
    return acc, m_i, l_i
