"""Compile the fused decoder kernels, the greedy sampling and draw kernels, the one-row
matrix-vector kernel and the skinny matrix product for a Hopper GPU (sm_90) without a GPU, through PTX and ptxas;
the norm and skinny kernels also as programmatic dependent launch compiles them.

Run as a script in a process without TRITON_INTERPRET (the interpreter accepts code the compiler
rejects). Shapes of Llama-3.1-8B in bfloat16 (and a float32 case with HELIOS_COMPILE_SWEEP=1: the same
code, the element type of the loads and stores alone differs), with the specialisation a launch
gives (pointers and leading strides multiples of 16); the skinny product at four of its tiles (every
tile with HELIOS_COMPILE_SWEEP=1). Exits 0 when every kernel compiles.
"""

from __future__ import annotations

import triton
from triton.compiler import ASTSource

from compile_attention_kernels import SWEEP, TARGET  # sm_90

from helios.abi import triton_draws, triton_fused, triton_gemv, triton_sampling, triton_skinny
from helios.abi.dependent_launch import PREFETCH_COLUMNS
from helios.abi.gemv_tiles import GEMV_TILES, SKINNY_TILES, SkinnyTile


def compile_kernel(kernel, types: dict[str, str], constants: dict[str, object], divisible: tuple = (),
                   **options) -> None:
    """Compile `kernel` with pointer/scalar `types` (others i32) and constexpr `constants`; the
    integers named in `divisible` are multiples of 16, as a launch specialises them."""
    names = kernel.arg_names
    defaults = {p.name: p.default for p in kernel.params if p.is_constexpr and p.has_default}
    constants = {**defaults, **constants}  # constexpr parameters left at their defaults, as a launch does
    signature = {name: "constexpr" if name in constants else types.get(name, "i32") for name in names}
    aligned = {(index,): [["tt.divisibility", 16]] for index, name in enumerate(names)
               if name not in constants and (signature[name].startswith("*") or name in divisible)}
    source = ASTSource(fn=kernel, signature=signature, attrs=aligned,
                       constexprs={(names.index(name),): value for name, value in constants.items()})
    compiled = triton.compile(source, target=TARGET, options=options)
    print(f"{kernel.fn.__name__}: {compiled.metadata.shared} bytes of shared memory")


def compile_fused(dtype: str, every_variant: bool = True) -> None:
    """Each kernel's variants; `every_variant` False (and no HELIOS_COMPILE_SWEEP=1): each flag once
    (the other dtype's pass compiles every combination)."""
    pointer = f"*{dtype}"
    every_variant = every_variant or SWEEP
    for has_delta, pdl in ((False, False), (False, True), (True, False), (True, True)) if every_variant else (
            (False, True), (True, False)):  # with programmatic dependent launch too
            compile_kernel(triton_fused._rms_norm_kernel,
                           dict(x=pointer, delta=pointer, weight=pointer, summed=pointer, normed=pointer, eps="fp32"),
                           dict(HAS_DELTA=has_delta, BLOCK_D=4096, PDL=pdl), num_warps=16, launch_pdl=pdl)
    compile_kernel(triton_fused._silu_mul_kernel, dict(gate_up=pointer, out=pointer), dict(BLOCK=1024), num_warps=4)
    compile_kernel(triton_fused._silu_mul_columns_kernel, dict(gate_up=pointer, out=pointer),
                   dict(BLOCK_R=triton_fused._COLUMNS_ROWS, BLOCK_C=triton_fused._COLUMNS_COLS), num_warps=8)
    for store_kv in (False, True) if every_variant else (True,):  # dense keys and values too (attention over
        # the step's own keys)
        compile_kernel(triton_fused._rotary_cache_write_kernel,
                       dict(q=pointer, k=pointer, v=pointer, cos=pointer, sin=pointer, k_cache=pointer,
                            v_cache=pointer, slot_mapping="*i64", q_out=pointer, k_out=pointer,
                            v_out=pointer),
                       dict(HEAD_BLOCK=8, BLOCK_D=128, STORE_KV=store_kv), num_warps=4)
    compile_kernel(triton_fused._zero_outside_rows_kernel, dict(out=pointer, query_start="*i32"),
                   dict(BLOCK_T=triton_fused._ZERO_TOKENS, BLOCK_W=triton_fused._ZERO_WIDTH), num_warps=4)


def compile_sampling() -> None:
    types = dict(logits="*fp32", penalties="*fp32", prompt_counts="*i32", output_counts="*i32",
                 grammar_mask="*i32", mask_rows="*i1", part_values="*fp64", part_ids="*i64", values_out="*fp64")
    # Without HELIOS_COMPILE_SWEEP=1 each of STORE_VALUES, PLAIN_F32 and the slot index types once and
    # together with either of the others (the flags guard separate loads and stores): four of eight.
    pairs = ((False, False), (False, True), (True, False), (True, True))
    for store, plain in pairs if SWEEP else ((False, False), (True, True)):
        compile_kernel(triton_sampling._greedy_partial_kernel, types,
                       dict(NUM_SPLITS=64, BLOCK_V=triton_sampling.BLOCK, STORE_VALUES=store, PLAIN_F32=plain,
                            ROW_SLOTS=False))
    slotted = tuple((slots, plain) for slots in ("*i32", "*i64") for plain in (False, True))
    # counts read at each row's slot of the per-slot tables (greedy_rows)
    for slots, plain in slotted if SWEEP else (("*i32", True), ("*i64", False)):
        compile_kernel(triton_sampling._greedy_partial_kernel, dict(types, row_slots=slots),
                       dict(NUM_SPLITS=64, BLOCK_V=triton_sampling.BLOCK, STORE_VALUES=False, PLAIN_F32=plain,
                            ROW_SLOTS=True))
    compile_kernel(triton_sampling._greedy_combine_kernel, dict(part_values="*fp64", part_ids="*i64", tokens="*i64"),
                   dict(NUM_SPLITS=64))
    rows = dict(values="*fp64", stride="i64", drawing="*i1", temperature="*fp32", bests="*fp64", sums="*fp64",
                totals="*fp64")
    for raw in (False, True):  # softmax probabilities (sample, sampling_weights), given weights (draw_weighted)
        whole = dict(S=triton_draws.SPLITS, BLOCK_V=triton_draws.ROW_BLOCK, RAW=raw)
        compile_kernel(triton_draws._exp_sum_kernel, dict(rows, greedy="*i64"), whole,
                       num_warps=triton_draws.ROW_WARPS)
        buckets = dict(whole, NB=triton_draws.NUM_BUCKETS, GROUP=triton_draws.FIRST_GROUP)
        compile_kernel(triton_draws._probability_kernel,
                       dict(rows, min_p="*fp32", counts="*i64", bucket_counts="*i64", bucket_masses="*fp64"),
                       buckets, num_warps=triton_draws.ROW_WARPS)
        # RAW changes the partition and draw kernels in `_key_max` alone: without HELIOS_COMPILE_SWEEP=1 the
        # partition compiles without it, the draw with RAW (not KEEP) and with KEEP (not RAW): each branch once.
        if SWEEP or not raw:
            compile_kernel(triton_draws._partition_kernel,
                           dict(rows, bucket_counts="*i64", candidate_p="*fp64", candidate_ids="*i32"),
                           buckets, num_warps=triton_draws.ROW_WARPS)
        keeps = (False, True) if not raw else (False,)
        for keep in keeps if SWEEP or raw else (True,):  # keep: sampling_weights' kept prefix
            compile_kernel(triton_draws._draw_kernel,
                           dict(greedy="*i64", drawing="*i1", top_k="*i32", top_p="*fp32", uniforms="*fp64",
                                bests="*fp64", totals="*fp64", counts="*i64", bucket_counts="*i64",
                                bucket_masses="*fp64", candidate_p="*fp64", candidate_ids="*i32", out="*i64"),
                           dict(S=triton_draws.SPLITS, BLOCK_V=triton_draws.SELECT_BLOCK, WIDE=triton_draws.TIE_BLOCK,
                                NB=triton_draws.NUM_BUCKETS, GROUP=triton_draws.FIRST_GROUP, RAW=raw, KEEP=keep),
                           num_warps=triton_draws.SELECT_WARPS)
    compile_kernel(triton_draws._keep_kernel,
                   dict(values="*fp64", stride="i64", drawing="*i1", greedy="*i64", boundary="*i64",
                        vocab_size="i32", chunk="i32"),
                   dict(BLOCK_V=triton_draws.ROW_BLOCK), num_warps=triton_draws.ROW_WARPS)


def compile_gemv() -> None:
    """Every tile of the committed table (and the default), with and without a bias, one row."""
    for tile in sorted(set(GEMV_TILES.values()) | {triton_gemv.GemvTile()}, key=lambda t: t.label):
        for has_bias in (False, True):
            compile_kernel(triton_gemv._gemv_kernel, dict(x_ptr="*bf16", w_ptr="*bf16", bias_ptr="*bf16",
                                                          out_ptr="*bf16"),
                           dict(ROWS=1, HAS_BIAS=has_bias, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k),
                           num_warps=tile.num_warps)


# The skinny tiles the suite compiles: the default, the fewest rows and warps, the largest tile, a reduction
# split in two. Every other tile of the committed table and the reduction split in four (64x32x256/4w4s4: the
# split-in-two tile's code, the last program's static sum unrolled four times) only with HELIOS_COMPILE_SWEEP=1
# (the suite's time: each tile compiles the same kernel variants, the tile alone differs). Of them only
# `SUITE_SKINNY_VARIANTS` compile every variant (bias, dependent launch with prefetched columns, the SiLU-mul
# with and without it); the others the served one (dependent launch, prefetch; no bias), for their sizes.
SUITE_SKINNY = ("64x64x128/1w4s4", "16x32x256/1w2s6", "128x128x64/1w8s4", "16x64x256/2w4s5")
SUITE_SKINNY_VARIANTS = ("64x64x128/1w4s4", "16x64x256/2w4s5")  # a whole and a split reduction


def compile_skinny() -> None:
    """Every tile of the committed table (`SUITE_SKINNY` of them without HELIOS_COMPILE_SWEEP=1) and a
    whole and a split reduction, with and without a bias, and the SiLU-mul epilogue's kernel for each
    tile it takes."""
    tiles = set(SKINNY_TILES.values()) | {SkinnyTile(), SkinnyTile.parse("64x32x256/4w4s4"),
                                           SkinnyTile.parse("128x128x64/1w8s4")}
    if not SWEEP:
        missing = set(SUITE_SKINNY) - {tile.label for tile in tiles}
        assert not missing, f"the suite's skinny tiles {sorted(missing)} are no longer in the table: pick others"
        tiles = {tile for tile in tiles if tile.label in SUITE_SKINNY}
    launches = ((False, 0), (True, PREFETCH_COLUMNS))  # (programmatic dependent launch, prefetched columns)
    for tile in sorted(tiles, key=lambda t: t.label):
        every_variant = SWEEP or tile.label in SUITE_SKINNY_VARIANTS
        variants = ((False, launches[0]), (True, launches[0]), (False, launches[1]))
        for (has_bias, (pdl, prefetch)) in variants if every_variant else variants[-1:]:
            compile_kernel(triton_skinny._skinny_kernel,
                           dict(x_ptr="*bf16", w_ptr="*bf16", bias_ptr="*bf16", out_ptr="*bf16", partial_ptr="*fp32",
                                counter_ptr="*i32"),
                           dict(HAS_BIAS=has_bias, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k,
                                SPLIT_K=tile.split_k, PDL=pdl, PREFETCH=prefetch),
                           divisible=("span", "stride_xm", "stride_wn", "stride_om"),
                           num_warps=tile.num_warps, num_stages=tile.num_stages, launch_pdl=pdl)
        if triton_skinny.silu_fits(tile.block_m, 2 * 14336, 4096, tile):  # the SiLU-mul in the epilogue
            for pdl, prefetch in launches if every_variant else launches[-1:]:
                compile_kernel(triton_skinny._skinny_silu_kernel, dict(x_ptr="*bf16", w_ptr="*bf16", out_ptr="*bf16"),
                               dict(BLOCK_M=tile.block_m, BLOCK_F=tile.block_n // 2, BLOCK_K=tile.block_k, PDL=pdl,
                                    PREFETCH=prefetch),
                               divisible=("width", "depth", "stride_xm", "stride_wn", "stride_om"),
                               num_warps=tile.num_warps, num_stages=tile.num_stages, launch_pdl=pdl)


if __name__ == "__main__":
    compile_skinny()
    compile_gemv()
    compile_fused("bf16")
    if SWEEP:  # the float32 pass: each flag once (the bfloat16 pass compiles every kernel's code)
        compile_fused("fp32", every_variant=False)
    compile_sampling()
