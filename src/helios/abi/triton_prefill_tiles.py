"""How the prefill kernel (`helios.abi.triton_prefill`) is shaped: its tiles, the served tile tables by
launch size, and the split-KV rule. Static numbers only (shapes and the device), so every choice is
fixed when a CUDA graph is captured.

Two layouts of a program's M dimension (the rows of its ``tl.dot``):

- packed (``per_head=False``): ``block_pairs`` (token, query head) pairs, BLOCK_M tokens x the GQA
  group's query heads, token-major: one load of each key/value tile serves the whole group (short
  rows and decode lanes keep the dot's M full);
- per head (``per_head=True``): ``block_pairs`` consecutive tokens of one query head, as in the
  FlashAttention tutorials; the group's heads are adjacent programs of the grid (heads on its first
  axis), so their key/value tiles are read from L2 after the first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from helios.abi.triton_paged import multiprocessors

__all__ = [
    "DEFAULT_PREFILL_TILE", "LONG_PREFILL_TILES", "LONG_PREFILL_TOKENS", "PREFILL_MAX_SPLITS",
    "PREFILL_MIN_SPLIT_TOKENS", "PREFILL_PROGRAMS_PER_MULTIPROCESSOR", "PREFILL_TILES", "SHORT_PREFILL_TILES",
    "SHORT_PREFILL_TOKENS", "SHORT_ROWS_TILE", "PrefillTile", "parse_tile", "prefill_splits", "prefill_tile",
]

# Split-KV schedule of the prefill kernel: about PREFILL_PROGRAMS_PER_MULTIPROCESSOR programs per
# multiprocessor, runs of at least PREFILL_MIN_SPLIT_TOKENS positions, at most PREFILL_MAX_SPLITS splits.
# One program per multiprocessor: a 128-pair, 8-warp program holds one multiprocessor's registers, and
# a split past one wave adds a wave (bench/prefill_attention.py's "suggested" line measures the value).
PREFILL_PROGRAMS_PER_MULTIPROCESSOR = 1
PREFILL_MIN_SPLIT_TOKENS = 256
PREFILL_MAX_SPLITS = 16


@dataclass(frozen=True)
class PrefillTile:
    """How one prefill program is shaped: `block_pairs` rows of its dot (a power of two, at least 16:
    (token, query head) pairs, or tokens of one head when `per_head`), `block_n` cached positions per
    iteration (a power of two, at least 16), the Triton launch options, the shortest run a split gets
    (`min_split_tokens`, rounded up to whole tiles: a span is cut into fewer splits rather than
    shorter ones), the most splits the rule may give (`max_splits`; 1: never split, no combine
    launch), `fused_combine`: a split block's last run merges the partials itself (no combine
    launch), and `contiguous`: unmasked tiles on consecutive pages are read through tensor
    descriptors (TMA). A schedule only: every tile gives the same result."""

    block_pairs: int = 128
    block_n: int = 64
    num_warps: int = 8
    num_stages: int = 3
    min_split_tokens: int = PREFILL_MIN_SPLIT_TOKENS
    max_splits: int = PREFILL_MAX_SPLITS
    per_head: bool = False
    fused_combine: bool = False
    contiguous: bool = False

    @property
    def min_split_tiles(self) -> int:
        return max(1, -(-self.min_split_tokens // self.block_n))

    def heads_per_program(self, group: int) -> int:
        """Query heads one program serves: the GQA group (packed) or one (per head)."""
        return 1 if self.per_head else group

    def block_tokens(self, group: int) -> int:
        """Tokens per query block (BLOCK_M) at GQA group `group`."""
        return self.block_pairs if self.per_head else max(1, self.block_pairs // triton.next_power_of_2(group))

    @property
    def name(self) -> str:
        """``[h][c][t]PAIRSxNxWARPSxSTAGES[xMIN_SPLIT[xMAX_SPLITS]]`` (h: per head, c: fused combine, t:
        descriptor loads on consecutive pages), as `parse_tile` reads it."""
        fields = [self.block_pairs, self.block_n, self.num_warps, self.num_stages]
        if self.max_splits != PREFILL_MAX_SPLITS:
            fields += [self.min_split_tokens, self.max_splits]
        elif self.min_split_tokens != PREFILL_MIN_SPLIT_TOKENS:
            fields.append(self.min_split_tokens)
        flags = "h" * self.per_head + "c" * self.fused_combine + "t" * self.contiguous
        return flags + "x".join(map(str, fields))


def parse_tile(name: str) -> PrefillTile:
    """The tile of a `PrefillTile.name` string (benchmarks take tiles on the command line)."""
    flags = {}
    rest = name
    for flag, field in (("h", "per_head"), ("c", "fused_combine"), ("t", "contiguous")):
        flags[field] = rest.startswith(flag)
        rest = rest.removeprefix(flag)
    try:
        fields = [int(part) for part in rest.split("x")]
    except ValueError:
        fields = []
    if not 4 <= len(fields) <= 6:
        raise ValueError(f"prefill tile {name!r}: expected [h][c][t]PAIRSxNxWARPSxSTAGES[xMIN_SPLIT[xMAX_SPLITS]]")
    return PrefillTile(*fields, **flags)


DEFAULT_PREFILL_TILE = PrefillTile()
# Batches whose rows hold fewer tokens than one default block on average (decode lanes among prompt
# rows): 16 tokens x 4 heads, 4 warps, the shape of the kernel before this one, so a one-token row's
# block wastes no more than it did.
SHORT_ROWS_TILE = PrefillTile(64, 64, 4, 2)
_WIDE_TILE = PrefillTile(64, 32, 4, 2)  # head rows over 256 bytes (float32, head_dim > 128): less shared memory
# Measured tiles by head_dim, from the "suggested ..._TILES" lines of `bench/prefill_attention.py` on
# the serving device class; absent keys use DEFAULT_PREFILL_TILE. The H200 entries come from its sweep
# of 2026-12-01 (bench/results/h200_session18_call5/prefill_attention.log), per layer at 8B shapes:
# - middle launches: the fused combine (no combine launch), 208 tokens after 1,840 cached in a
#   256-token capacity 47.5 us against 51.6 with the default tile, 512 cold 27.9 against 27.8;
PREFILL_TILES: dict[int, PrefillTile] = {128: parse_tile("c128x64x8x3")}
# - launches of at least LONG_PREFILL_TOKENS: per-head blocks of 64 tokens x 64 positions, with
#   descriptor loads where a program's pages are consecutive, as a cold prompt's are (the page
#   allocator hands it a run of consecutive pages: `helios.runtime.cache.pages`): 2,048 cold 102.6 us
#   on consecutive pages against 111.9 with the 128 x 128 per-head tile served before (153.7 against
#   145.6 on shuffled pages; bench/results/ttft_session1/prefill_kernels_ab.json); the 128 x 128 tile
#   against 164.7 / 163.6 with 128 x 128 packed tiles and 167 with SDPA's flash kernel on contiguous
#   keys (the sweep above);
LONG_PREFILL_TOKENS = 1024
LONG_PREFILL_TILES: dict[int, PrefillTile] = {128: parse_tile("ht64x64x4x3")}
# - launches of fewer than SHORT_PREFILL_TOKENS: 16 tokens x 4 heads, 4 warps, split with the fused
#   combine: 128 cold 14.8 us (the previous kernel 14.3, the default tile's 4 split launches 17.8),
#   128 after 1,920 cached 48.6 against 74.7 unsplit.
SHORT_PREFILL_TOKENS = 256
SHORT_PREFILL_TILES: dict[int, PrefillTile] = {128: parse_tile("c64x64x4x2")}


def prefill_tile(head_dim: int, dtype: torch.dtype, num_tokens: int | None = None, num_rows: int = 0) -> PrefillTile:
    """The tile for a prefill launch of `num_tokens` packed tokens in `num_rows` rows, from static
    numbers only: SHORT_ROWS_TILE where the rows average fewer tokens than the tile's blocks at GQA
    group 4, the size class's table entry for 16-bit inputs (LONG_PREFILL_TILES' from
    LONG_PREFILL_TOKENS, SHORT_PREFILL_TILES' below SHORT_PREFILL_TOKENS, else PREFILL_TILES'; None
    tokens: PREFILL_TILES'), else the default (a narrower one where a head row exceeds 256 bytes)."""
    if head_dim * dtype.itemsize > 256:
        return _WIDE_TILE
    tile = PREFILL_TILES.get(head_dim, DEFAULT_PREFILL_TILE)
    if num_tokens is None:
        return tile
    if dtype.itemsize == 2:
        if num_tokens >= LONG_PREFILL_TOKENS:
            tile = LONG_PREFILL_TILES.get(head_dim, tile)
        elif num_tokens < SHORT_PREFILL_TOKENS:
            tile = SHORT_PREFILL_TILES.get(head_dim, tile)
    if num_tokens < num_rows * tile.block_tokens(4):  # rows of fewer tokens than a block
        return SHORT_ROWS_TILE
    return tile


def prefill_splits(num_blocks: int, heads_per_block: int, max_context: int, device: torch.device,
                   min_split_tokens: int = PREFILL_MIN_SPLIT_TOKENS,
                   per_multiprocessor: int = PREFILL_PROGRAMS_PER_MULTIPROCESSOR,
                   max_splits: int = PREFILL_MAX_SPLITS) -> int:
    """Splits of a prefill launch of `num_blocks` query blocks (the grid's bound, ``T // BLOCK_M + R``)
    of `heads_per_block` programs each (key/value heads packed, query heads per head), from static
    numbers only (fixed when a graph is captured): enough for about `per_multiprocessor` programs per
    multiprocessor, no more than one per `min_split_tokens` positions of the capacity context, at
    most `max_splits` (and PREFILL_MAX_SPLITS)."""
    programs = max(1, num_blocks * heads_per_block)
    wanted = -(-per_multiprocessor * multiprocessors(device) // programs)
    useful = -(-max_context // min_split_tokens)
    return max(1, min(wanted, useful, max_splits, PREFILL_MAX_SPLITS))
