"""Compile the Triton latent-attention kernels for a Hopper GPU (sm_90) without a GPU (PTX and ptxas).

Run as a script in a process without TRITON_INTERPRET (the interpreter accepts code the compiler
rejects). Shapes of DeepSeek-V3 (latent 512, rotary key 64, pages of 16) in bfloat16 and the test
checkpoints' float32 shape, with the specialisation a launch gives (pointers and strides multiples of
16). Exits 0 when every kernel compiles; prints each kernel's shared memory use.
"""

from __future__ import annotations

import triton

from compile_attention_kernels import SWEEP, compile_kernel
from helios.abi import triton_latent as kernels


def compile_all(dtype: str, latent: int, rope: int, precision: str, heads: int, every_variant: bool = True) -> None:
    """Each tile split and unsplit; `every_variant` False (and no HELIOS_COMPILE_SWEEP=1): each tile once,
    split (decode) or unsplit (the multi-token tile), and the other dtype's pass the other way round."""
    pointer = f"*{dtype}"
    block_c, block_r = max(16, triton.next_power_of_2(latent)), max(16, triton.next_power_of_2(rope))
    types = dict(out_ptr=pointer, q_latent_ptr=pointer, q_rope_ptr=pointer, latent_cache_ptr=pointer,
                 rope_cache_ptr=pointer, page_table_ptr="*i32", query_start_ptr="*i32", positions_ptr="*i64",
                 scale="fp32")
    types.update(part_m_ptr="*fp32", part_l_ptr="*fp32", part_o_ptr="*fp32")
    # The tiles launches choose: one token per tile (decode) and a multi-token tile (prefill, mixed).
    tiles = {kernels.latent_tiles(1, 1, heads, latent), kernels.latent_tiles(64, 1, heads, latent)}
    variants = [(tile, splits) for tile in sorted(tiles) for splits in (1, 8)]
    if not (every_variant or SWEEP):
        decode = kernels.latent_tiles(1, 1, heads, latent)
        variants = [(tile, (8 if tile == decode else 1) if dtype == "bf16" else (1 if tile == decode else 8))
                    for tile in sorted(tiles)]
    for (block_h, block_t), splits in variants:
        compile_kernel(kernels._latent_attention_kernel, types,
                       dict(LATENT_DIM=latent, ROPE_DIM=rope, BLOCK_C=block_c, BLOCK_R=block_r, BLOCK_H=block_h,
                            BLOCK_T=block_t, BLOCK_N=32, PAGE_TOKENS=16, NUM_SPLITS=splits, DOT_PRECISION=precision),
                       num_warps=8 if block_c >= 256 else 4, num_stages=2)
    compile_kernel(kernels._latent_combine_kernel, types,
                   dict(LATENT_DIM=latent, BLOCK_C=triton.next_power_of_2(latent), NUM_SPLITS=8, BLOCK_S=8),
                   num_warps=4)
    compile_kernel(kernels._latent_write_kernel,
                   dict(latent_cache_ptr=pointer, rope_cache_ptr=pointer, latent_ptr=pointer, rope_ptr=pointer,
                        slot_ptr="*i64"),
                   dict(LATENT_DIM=latent, ROPE_DIM=rope, BLOCK_C=triton.next_power_of_2(latent),
                        BLOCK_R=triton.next_power_of_2(rope), PAGE_TOKENS=16))


if __name__ == "__main__":
    # Each tile split and unsplit once between the two passes (in bfloat16 decode's split, as long contexts
    # launch it); every variant of both with HELIOS_COMPILE_SWEEP=1
    compile_all("bf16", 512, 64, "tf32", heads=16, every_variant=False)
    compile_all("fp32", 32, 16, "ieee", heads=4, every_variant=False)
