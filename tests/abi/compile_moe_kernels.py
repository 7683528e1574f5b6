"""Compile the Triton expert kernels for a Hopper GPU (sm_90) without a GPU, through PTX and ptxas.

Run as a script in a process without TRITON_INTERPRET (see compile_attention_kernels.py): bfloat16 at
Qwen3-30B-A3B expert shapes (decode and prefill block sizes, both activations, with and without
biases) and float32. Exits 0 when every kernel compiles.
"""

from __future__ import annotations

from compile_attention_kernels import compile_kernel

from helios.abi import triton_moe as kernels

SCHEDULE = dict(order="*i64", block_expert="*i32", block_start="*i32", block_end="*i32")


def compile_all(dtype: str, precision: str) -> None:
    pointer = f"*{dtype}"
    gate_up = dict(SCHEDULE, hidden=pointer, gate_up=pointer, gate_up_bias=pointer, inter=pointer,
                   alpha="fp32", limit="fp32")
    down = dict(SCHEDULE, inter=pointer, route_weights="*fp32", down=pointer, down_bias=pointer, out="*fp32")
    for block_m, block_n in ((16, 32), (16, 64), (64, 64)):
        for bias in (False, True):
            for activation in (0, 1):
                compile_kernel(kernels._gate_up_kernel, gate_up,
                               dict(HAS_BIAS=bias, ACTIVATION=activation, BLOCK_M=block_m, BLOCK_N=block_n,
                                    BLOCK_K=64, DOT_PRECISION=precision), num_warps=4)
            compile_kernel(kernels._down_kernel, down, dict(HAS_BIAS=bias, BLOCK_M=block_m, BLOCK_N=block_n,
                                                            BLOCK_K=64, DOT_PRECISION=precision), num_warps=4)


if __name__ == "__main__":
    compile_all("bf16", "tf32")
    compile_all("fp32", "ieee")
