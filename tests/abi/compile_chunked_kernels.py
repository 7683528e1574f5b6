"""Compile the Triton kernel of helios::paged_attention_chunked for a Hopper GPU (sm_90) without a GPU
(PTX and ptxas).

Run as a script in a process without TRITON_INTERPRET (the interpreter accepts code the compiler
rejects). Llama 4 Scout's shape (bfloat16, 40 query heads over 8 key/value heads, head_dim 128, pages
of 16) and the test checkpoint's float32 shape (group 2, head_dim 16), with the specialisation a launch
gives (unit strides constant, the rest multiples of 16). Exits 0 when both compile; prints each
one's shared memory use.
"""

from __future__ import annotations

import triton

from compile_attention_kernels import compile_kernel
from helios.abi import triton_chunked as kernels


def compile_shape(dtype: str, group: int, head_dim: int, precision: str) -> None:
    pointer = f"*{dtype}"
    types = dict(out_ptr=pointer, q_ptr=pointer, k_ptr=pointer, v_ptr=pointer, page_table_ptr="*i32",
                 query_start_ptr="*i32", positions_ptr="*i64", scale_log2="fp32")
    compile_kernel(kernels._chunked_kernel, types,
                   dict(GROUP=group, BLOCK_M=max(16, triton.next_power_of_2(group)), BLOCK_N=kernels.BLOCK_N,
                        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), HEAD_DIM=head_dim, PAGE_TOKENS=16,
                        DOT_PRECISION=precision))


if __name__ == "__main__":
    compile_shape("bf16", 5, 128, "tf32")
    compile_shape("fp32", 2, 16, "ieee")
