"""Compile the Triton expert kernels for a Hopper GPU (sm_90) without a GPU, through PTX and ptxas.

Run as a script in a process without TRITON_INTERPRET (see compile_attention_kernels.py): bfloat16 at
Qwen3-30B-A3B expert shapes (decode and prefill block sizes, both activations, with and without
biases; Nemotron-H's non-gated relu2 at one block shape) and float32. The grouped kernels compile at the
smallest and the largest of the default tiles (16 x 32 and 64 x 64 rows x columns): in bfloat16 each
activation and each bias once at the smallest, one of each kernel at the largest; in float32 one of each
kernel at the smallest (the gemv kernels likewise: each activation and bias once in bfloat16, one of each in
float32); every variant, the two tiles between (16 x 64, 32 x 64) and float32 at every tile only with
HELIOS_COMPILE_SWEEP=1. The router at three of its five model configurations (each scoring, with and without
groups and a bias; all five with the sweep). Exits 0 when every kernel compiles.
"""

from __future__ import annotations

from compile_attention_kernels import SWEEP, compile_kernel

from helios.abi import triton_moe as kernels
from helios.abi import triton_route

SCHEDULE = dict(order="*i64", block_expert="*i32", block_start="*i32", block_end="*i32")
# The grouped kernels' (BLOCK_M, BLOCK_N): moe_tiles.default_tiles' smallest and largest; the two between
# them only with HELIOS_COMPILE_SWEEP=1 (the suite's time; the same variants, the tile alone differs)
BLOCKS = ((16, 32), (64, 64)) + (((16, 64), (32, 64)) if SWEEP else ())


# Without HELIOS_COMPILE_SWEEP=1, the (bias, activation) variants of the bfloat16 pass at the smallest block: each
# activation (0, 1 and relu2, 2) and each bias once (the flags guard separate code; every pair with the sweep)
SUITE_GROUPED = ((False, 0), (False, 2), (True, 1))
SUITE_GEMV = ((False, 0), (True, 1), (True, 2))


def compile_all(dtype: str, precision: str, every_variant: bool = True) -> None:
    """The grouped kernels at each of BLOCKS: the SUITE_GROUPED variants at the smallest (every bias and
    activation variant with HELIOS_COMPILE_SWEEP=1, at each block), one of each kernel at the others;
    `every_variant` False: one of each kernel at the smallest block (at each with the sweep: the variants'
    code is the other dtype's pass's, the dtype alone differs)."""
    pointer = f"*{dtype}"
    gate_up = dict(SCHEDULE, hidden=pointer, gate_up=pointer, gate_up_bias=pointer, inter=pointer,
                   alpha="fp32", limit="fp32")
    down = dict(SCHEDULE, inter=pointer, route_weights="*fp32", down=pointer, down_bias=pointer, out="*fp32")
    for block_m, block_n in BLOCKS if every_variant or SWEEP else BLOCKS[:1]:
        variants = SWEEP or (every_variant and (block_m, block_n) == BLOCKS[0])
        for bias in (False, True) if variants else (True,):
            activations = (0, 1, 2) if block_m == 16 and not bias else (0, 1)  # relu2 (2): one shape
            if variants and not SWEEP:
                activations = tuple(activation for suite_bias, activation in SUITE_GROUPED if suite_bias == bias)
            for activation in activations if variants else (1,):
                compile_kernel(kernels._gate_up_kernel, gate_up,
                               dict(HAS_BIAS=bias, ACTIVATION=activation, BLOCK_M=block_m, BLOCK_N=block_n,
                                    BLOCK_K=64, DOT_PRECISION=precision), num_warps=4)
            compile_kernel(kernels._down_kernel, down, dict(HAS_BIAS=bias, BLOCK_M=block_m, BLOCK_N=block_n,
                                                            BLOCK_K=64, DOT_PRECISION=precision), num_warps=4)


def compile_gemv(dtype: str, every_variant: bool = True) -> None:
    """SUITE_GEMV's variants (every one with HELIOS_COMPILE_SWEEP=1); `every_variant` False (and no
    sweep): one of each kernel (with a bias)."""
    pointer = f"*{dtype}"
    every_variant = every_variant or SWEEP
    for bias in (False, True) if every_variant else (True,):
        activations = (0, 1, 2) if bias else (0, 1)  # relu2 (2): with its bias
        if not SWEEP:
            activations = tuple(activation for suite_bias, activation in SUITE_GEMV if suite_bias == bias)
        for activation in activations if every_variant else (1,):
            compile_kernel(kernels._gate_up_gemv_kernel,
                           dict(hidden=pointer, ids="*i64", gate_up=pointer, gate_up_bias=pointer, inter=pointer,
                                alpha="fp32", limit="fp32"),
                           dict(HAS_BIAS=bias, ACTIVATION=activation, BLOCK_N=32, BLOCK_K=128), num_warps=4)
        compile_kernel(kernels._down_gemv_kernel,
                       dict(inter=pointer, ids="*i64", route_weights="*fp32", down=pointer, down_bias=pointer,
                            out="*fp32"), dict(HAS_BIAS=bias, BLOCK_N=32, BLOCK_K=128), num_warps=4)


ROUTES = [  # (scoring, experts, top_k, groups, kept groups, bias): Qwen3-MoE, GLM-4.5, DeepSeek-V3, gpt-oss,
    (0, 128, 8, 1, 1, False), (2, 160, 8, 1, 1, True), (2, 256, 8, 8, 4, True), (1, 32, 4, 1, 1, False),
    (0, 160, 6, 8, 3, False),  # DeepSeek-V2 (softmax groups)
]
# Without HELIOS_COMPILE_SWEEP=1: DeepSeek-V3 (sigmoid, bias, groups), gpt-oss (top-k softmax, one group) and
# DeepSeek-V2 (softmax, groups) take each scoring's branch, the bias's and the groups' with and without
SUITE_ROUTES = (ROUTES[2], ROUTES[3], ROUTES[4])


def compile_routes(dtype: str) -> None:
    for scoring, experts, top_k, groups, kept, bias in ROUTES if SWEEP else SUITE_ROUTES:
        size = experts // groups
        compile_kernel(triton_route._route_kernel,
                       dict(logits=f"*{dtype}", bias="*fp32", weights_out="*fp32", ids_out="*i64", scale="fp32"),
                       dict(SCORING=scoring, HAS_BIAS=bias, NORMALIZE=True, TOP_K=top_k, NUM_GROUPS=groups,
                            GROUP_SIZE=size, TOPK_GROUPS=kept, BLOCK_G=max(1, 1 << (groups - 1).bit_length()),
                            BLOCK_S=1 << (size - 1).bit_length(), BLOCK_K=1 << (top_k - 1).bit_length()),
                       num_warps=4)


if __name__ == "__main__":
    for rows in (16, 64):
        compile_kernel(kernels._schedule_kernel, dict(bounds="*i64", block_expert="*i32", block_start="*i32",
                                                      block_end="*i32"), dict(ROWS=rows, BLOCK_E=128, CHUNK=32))
    compile_routes("fp32")
    compile_gemv("bf16")
    compile_gemv("fp32", every_variant=False)
    compile_all("bf16", "tf32")
    compile_all("fp32", "ieee", every_variant=False)
