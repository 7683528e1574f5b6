"""Compile the Triton attention kernels for a Hopper GPU (sm_90) without a GPU, through PTX and ptxas.

Run as a script in a process without TRITON_INTERPRET (the interpreter accepts code the compiler
rejects, such as loop-carried values that change type). Kernels are compiled at Llama-3.1-8B shapes
(bfloat16, 32 query heads, 8 key/value heads, head_dim 128, pages of 16) and at a float16 head_dim 96,
group 3 case, with the specialisation a launch gives (unit strides constant, the rest multiples of 16);
in bfloat16 the prefill and decode kernels also with an attention soft cap
(``helios::paged_attention_softcap``).
Exits 0 when every kernel compiles; prints each kernel's shared memory use.
"""

from __future__ import annotations

import sys
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from helios.abi import triton_attention as kernels
from helios.abi import triton_decode as decode
from helios.abi import triton_prefill as prefill

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/, when run as a script
from support.sweeps import swept  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
UNIT_STRIDES = {"stride_qd", "stride_od", "stride_kd", "stride_vd", "stride_ktd", "stride_vtd"}
SWEEP = swept("HELIOS_COMPILE_SWEEP")
# The benchmark's swept decode configurations: (BLOCK_N, warps, stages, PREFETCH, BLOCK_KV, SPECULATE)
DECODE_SWEEP = ((32, 4, 3, 2, 1, False), (128, 8, 2, 0, 1, False), (128, 4, 4, 1, 1, False), (64, 4, 2, 2, 1, True),
                (8, 4, 3, 1, 8, False), (16, 8, 2, 2, 8, False), (32, 4, 2, 1, 2, False), (64, 4, 2, 1, 2, True),
                (16, 2, 3, 1, 4, False), (32, 4, 2, 1, 4, True), (16, 4, 2, 0, 4, False))
# Without HELIOS_COMPILE_SWEEP=1 (the suite's time) each code path of a kernel compiles once, at the runtime's shapes:
# prefill, the tiles of SUITE_PREFILL_TILES that the runtime launches at head_dim 128 (the default's packed unsplit
# blocks, the fused combine at 128 and at 64 tokens x 4 heads (every prefill tile the runtime launches compiles by
# default), the long prompts' per-head descriptor tile, compiled with the soft
# cap: the cap's code in the descriptor loads and in the gathered tiles); decode, the unsplit walk, the split walk with
# the fused combine (with sinks), the tuned walk (rotary, speculation, L2 prefetch, dependent launch) with the fused
# combine and the soft cap, and of the swept configurations SUITE_DECODE: prefetch 0 to 2, 4 and 8 warps, a partly wide
# tile (4 key/value heads a program, as the batch-256 tile), speculation and rotary on and off. In float16 (head_dim 96,
# group 3: the masked head and group lanes) the fused split of each kernel, with sinks (the prefill's sinks compile
# there). The others (the combine launch's variants beside the fused ones: the split blocks that leave their partials to
# the combine kernel are the fused split's code without its last run's merge, c128x64x8x3's compile; the combine kernel
# itself compiles in each pass; sinks and the cap on their own, the
# short-rows tile (the default's code at the short-rows tile's size), key/value blocks of 2 and 8 pages (the partly wide
# tile's code), float16's unsplit variants) only with the sweep.
PREFILL_SPLITS = ((1, False), (4, False), (4, True))  # (NUM_SPLITS, FUSED_COMBINE)
DECODE_SPLITS = ((1, False, False), (8, False, False), (8, False, True), (1, True, False), (8, True, False),
                 (8, True, True))  # (NUM_SPLITS, TUNED, FUSED)
# The bfloat16 pass's split variants without the sweep: (without sinks, with sinks); the prefill's unsplit and
# fused split variants are the 128x64x8x3 and c128x64x8x3 tiles' compiles (its sinks float16's fused split), the
# tuned decode one the capped one
SUITE_PREFILL_SPLITS = ((), ())
SUITE_DECODE_SPLITS = (((1, False, False),), ((8, False, True),))
SUITE_PREFILL_TILES = ("128x64x8x3", "c128x64x8x3", "c64x64x4x2", "ht64x64x4x3")
SUITE_DECODE = ((128, 8, 2, 0, 1, False), (64, 4, 2, 2, 1, True), (32, 4, 2, 1, 4, True))


def compile_kernel(kernel, types: dict[str, str], constants: dict[str, object], **options):
    """Compile `kernel` with pointer/scalar `types` (others i32) and constexpr `constants` (constexpr
    parameters not named keep their defaults, as a launch does: PDL, SOFTCAP); absent
    tensor-descriptor arguments (`*_desc`) are None."""
    names = kernel.arg_names
    defaults = {p.name: p.default for p in kernel.params if p.is_constexpr and p.has_default}
    constants = {**defaults, **constants, **{name: 1 for name in names if name in UNIT_STRIDES},
                 **{name: None for name in names if name.endswith("_desc") and name not in types}}
    signature = {name: "constexpr" if name in constants else types.get(name, "i32") for name in names}
    aligned = {(index,): [["tt.divisibility", 16]] for index, name in enumerate(names)
               if name not in constants and (name.endswith("_ptr") or name.startswith("stride"))}
    source = ASTSource(fn=kernel, signature=signature, attrs=aligned,
                       constexprs={(names.index(name),): value for name, value in constants.items()})
    compiled = triton.compile(source, target=TARGET, options=options)
    print(f"{kernel.fn.__name__} {options}: {compiled.metadata.shared} bytes of shared memory")


def compile_all(dtype: str, group: int, head_dim: int, capped: bool = False, swept: bool = True,
                every_split: bool = True) -> None:
    """Every kernel at these shapes; `capped`: the soft-capped prefill (one contiguous tile; with
    HELIOS_COMPILE_SWEEP=1 the split, fused combine at the default tile too) and decode (tuned, fused);
    `every_split` False (and no HELIOS_COMPILE_SWEEP=1): of the split variants only the fused split ones,
    with sinks (see `split_variants`)."""
    pointer = f"*{dtype}"
    block_d = triton.next_power_of_2(head_dim)
    attend = dict(out_ptr=pointer, q_ptr=pointer, k_ptr=pointer, v_ptr=pointer, page_table_ptr="*i32",
                  query_start_ptr="*i32", positions_ptr="*i64", splits_ptr="*i32", sinks_ptr="*fp32",
                  scale_log2="fp32",
                  part_m_ptr="*fp32", part_l_ptr="*fp32", part_o_ptr="*fp32", count_ptr="*i32",
                  counters_ptr="*i32", k_new_ptr=pointer, v_new_ptr=pointer, cos_ptr=pointer, sin_ptr=pointer,
                  slot_ptr="*i64", prefetch_ptr=pointer)
    shape = dict(GROUP=group, HEAD_DIM=head_dim, BLOCK_D=block_d, PAGE_TOKENS=16, DOT_PRECISION="tf32")
    block_g = triton.next_power_of_2(group)
    every_split = every_split or SWEEP
    for sinks in (False, True):  # sinks: helios::paged_attention_sinks(_tuned)
        # split-KV: partials, combine kernel or fused; see PREFILL_SPLITS for the suite's subset
        for splits, fused in split_variants(PREFILL_SPLITS, SUITE_PREFILL_SPLITS, sinks, every_split):
            compile_kernel(prefill._prefill_kernel, attend,
                           dict(shape, HEADS=group, HEADS_FIRST=False, BLOCK_G=block_g, BLOCK_M=128 // block_g,
                                BLOCK_N=64, HAS_SINKS=sinks, NUM_SPLITS=splits, MIN_TILES=4, FUSED_COMBINE=fused,
                                CONTIGUOUS=False),
                           num_warps=8, num_stages=3)
        # tuned: the count is read on the device
        for splits, tuned, fused in split_variants(DECODE_SPLITS, SUITE_DECODE_SPLITS, sinks, every_split):
            compile_kernel(decode._decode_kernel, attend,
                           dict(shape, BLOCK_H=16, BLOCK_N=64, NUM_SPLITS=splits, TUNED=tuned, HAS_SINKS=sinks,
                                MIN_TILES=2, FUSED=fused, PREFETCH=1, BLOCK_KV=1, SPECULATE=tuned,
                                ROTARY=tuned, KV_PAD=1, L2_PREFETCH=tuned and fused,  # helios::rotary_paged_attention
                                PDL=tuned),  # programmatic dependent launch: a wait first thing
                           num_warps=4, num_stages=2, launch_pdl=tuned)
    # helios::paged_attention_softcap (Gemma 2's cap 50); without the sweep the prefill's cap compiles in the
    # descriptor tile below (its gathered tiles take the same capped step as these)
    for splits, fused in ((4, True),) if capped and SWEEP else ():
        compile_kernel(prefill._prefill_kernel, attend,
                       dict(shape, HEADS=group, HEADS_FIRST=False, BLOCK_G=block_g, BLOCK_M=128 // block_g,
                            BLOCK_N=64, HAS_SINKS=False, NUM_SPLITS=splits, MIN_TILES=4, FUSED_COMBINE=fused,
                            CONTIGUOUS=False, SOFTCAP=50.0),
                       num_warps=8, num_stages=3)
    for splits, tuned, fused in ((8, True, True),) if capped else ():
        compile_kernel(decode._decode_kernel, attend,
                       dict(shape, BLOCK_H=16, BLOCK_N=64, NUM_SPLITS=splits, TUNED=tuned, HAS_SINKS=False,
                            MIN_TILES=2, FUSED=fused, PREFETCH=1, BLOCK_KV=1, SPECULATE=tuned, ROTARY=False,
                            KV_PAD=1, L2_PREFETCH=False, PDL=tuned, SOFTCAP=50.0),
                       num_warps=4, num_stages=2, launch_pdl=tuned)
    capped_contiguous = not capped  # one contiguous (descriptor) tile with the cap too
    for tile in prefill_sweep_tiles(SWEEP) if swept else ():  # the benchmark's prefill tiles, split where they fuse
        heads = tile.heads_per_program(group)
        descriptor = f"tensordesc<{dtype}[{tile.block_n},{head_dim}]>"
        contiguous = tile.contiguous and head_dim == block_d  # the launcher's rule
        types = dict(attend, k_desc=descriptor, v_desc=descriptor) if contiguous else attend
        if SWEEP or not (contiguous and not capped_contiguous):  # else only capped (the cap's code is a superset)
            compile_kernel(prefill._prefill_kernel, types,
                           dict(shape, HEADS=heads, HEADS_FIRST=tile.per_head, BLOCK_G=triton.next_power_of_2(heads),
                                BLOCK_M=tile.block_tokens(group), BLOCK_N=tile.block_n, HAS_SINKS=False,
                                NUM_SPLITS=4 if tile.fused_combine else 1, MIN_TILES=tile.min_split_tiles,
                                FUSED_COMBINE=tile.fused_combine, CONTIGUOUS=contiguous),
                           num_warps=tile.num_warps, num_stages=tile.num_stages)
        if contiguous and not capped_contiguous:
            capped_contiguous = True
            compile_kernel(prefill._prefill_kernel, types,
                           dict(shape, HEADS=heads, HEADS_FIRST=tile.per_head, BLOCK_G=triton.next_power_of_2(heads),
                                BLOCK_M=tile.block_tokens(group), BLOCK_N=tile.block_n, HAS_SINKS=False,
                                NUM_SPLITS=4 if tile.fused_combine else 1, MIN_TILES=tile.min_split_tiles,
                                FUSED_COMBINE=tile.fused_combine, CONTIGUOUS=contiguous, SOFTCAP=50.0),
                           num_warps=tile.num_warps, num_stages=tile.num_stages)
    compile_kernel(prefill._prefill_combine_kernel, attend,
                   dict(BLOCK_M=128 // block_g, BLOCK_N=64, HEAD_DIM=head_dim, BLOCK_D=block_d, NUM_SPLITS=4,
                        MIN_TILES=4), num_warps=4)
    for block_n, warps, stages, prefetch, block_kv, speculate in (
            DECODE_SWEEP if SWEEP else SUITE_DECODE) if swept else ():  # swept
        compile_kernel(decode._decode_kernel, attend,
                       dict(shape, BLOCK_H=max(16, triton.next_power_of_2(group * block_kv)), BLOCK_N=block_n,
                            NUM_SPLITS=4, TUNED=True,
                            HAS_SINKS=False, MIN_TILES=max(1, 128 // block_n), FUSED=True, PREFETCH=prefetch,
                            BLOCK_KV=block_kv, SPECULATE=speculate, ROTARY=speculate,
                            KV_PAD=triton.next_power_of_2(block_kv), L2_PREFETCH=speculate),
                       num_warps=warps, num_stages=stages)
    for tuned in (False, True):
        compile_kernel(decode._combine_kernel, attend, dict(NUM_SPLITS=8, BLOCK_S=8, HEAD_DIM=head_dim,
                                                            BLOCK_D=block_d, TUNED=tuned, BLOCK_N=64, MIN_TILES=2))
    compile_kernel(kernels._cache_write_kernel,
                   dict(k_cache_ptr=pointer, v_cache_ptr=pointer, k_ptr=pointer, v_ptr=pointer, slot_ptr="*i64"),
                   dict(NUM_KV_HEADS=8, BLOCK_H=8, HEAD_DIM=head_dim, BLOCK_D=block_d, PAGE_TOKENS=16))


def split_variants(variants: tuple, suite: tuple, sinks: bool, every_split: bool) -> tuple:
    """The split variants compiled: all of them with the sweep; else where `every_split` those of
    `suite` (without sinks, with sinks), else with sinks the fused split (last) alone and none without."""
    if SWEEP:
        return variants
    if every_split:
        return suite[sinks]
    return variants[-1:] if sinks else ()


def prefill_sweep_tiles(full: bool = True) -> list[prefill.PrefillTile]:
    """The tiles `bench/prefill_attention.py` sweeps by default (each must fit an H200's shared memory);
    `full` False: those of them in `SUITE_PREFILL_TILES`."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from prefill_attention import TILES

    names = TILES.split(",")
    missing = set(SUITE_PREFILL_TILES) - set(names)
    assert full or not missing, f"the suite's prefill tiles {sorted(missing)} are no longer swept: pick others"
    return [prefill.parse_tile(name) for name in names if full or name in SUITE_PREFILL_TILES]


if __name__ == "__main__":
    compile_all("bf16", group=4, head_dim=128, capped=True)
    # The benchmark's swept tiles in bfloat16 (what it runs: all of them with HELIOS_COMPILE_SWEEP=1, else
    # SUITE_PREFILL_TILES and SUITE_DECODE); in float16 only with HELIOS_COMPILE_SWEEP=1 (the suite's time: each
    # swept tile compiles twice over otherwise, and the shapes differ only in dtype, group and head width,
    # which the default tiles above still cover), and of the split variants the fused ones, with sinks.
    compile_all("fp16", group=3, head_dim=96, swept=SWEEP, every_split=False)
