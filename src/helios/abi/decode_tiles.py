"""The decode kernel's tiles (`helios.abi.triton_decode`): how one program walks its positions, the
strings the benchmark prints and takes, and the shape-keyed table of measured tiles. No triton
import: a schedule only, every tile gives the same result.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from helios.abi.attention import MIN_SPLIT_TOKENS

__all__ = ["DECODE_TILES", "DEFAULT_TILE", "DecodeTile", "decode_tile"]


@dataclass(frozen=True)
class DecodeTile:
    """How one decode program walks its positions: `block_n` cached positions per iteration (a power
    of two, at least 16), the Triton launch options, and the shortest run a split gets
    (`min_split_tokens`, rounded up to whole tiles: a token's span is cut into fewer splits rather
    than shorter ones), whether the runs of a split token are merged in the decode launch
    (`fused_combine`) or by a combine launch after it, how far ahead a program loads (`prefetch`, see
    `walk`), and whether one program serves one key/value head of a token or all of them (`wide`:
    a tile of `block_n` positions holds every key/value head's keys, contiguous in a page, and the
    query heads' rows mask the others' columns), or of `kv_heads` of them (a power of two: a partly wide
    program, fewer and larger programs for short contexts at large batches: `kv_heads` 4 with a group
    of 4 fills the 16 rows of the dot that one key/value head pads), and whether a program loads its
    guessed row's first page entries before it knows its row (`speculate`, with prefetch 1 or 2: one
    dependent load fewer before the first keys), and a fixed split count (`splits`, 0: the tuned or
    static count; a table entry whose measured best count differs from the tuning rule's, such as a
    partly wide tile that needs splits to fill the device). A schedule only: every tile is exact."""

    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    min_split_tokens: int = MIN_SPLIT_TOKENS
    fused_combine: bool = True
    prefetch: int = 1
    wide: bool = False
    kv_heads: int = 1
    speculate: bool = False
    splits: int = 0

    @classmethod
    def parse(cls, text: str) -> "DecodeTile":
        """``block_n x num_warps x num_stages [x min_split_tokens [x prefetch]] [x c] [x w | x kN]``
        [x s] [x nN] (``c``: a combine launch, not fused; ``w``: wide; ``kN``: N key/value heads a
        program, a power of two; ``s``: speculate; ``nN``: N splits, fixed), as the benchmark prints and
        takes tiles, e.g. ``64x4x2x128x1xc``, ``16x8x2x64x1xw`` or ``32x4x2x128x1xk4xsxn2``."""
        fields = text.strip().lower().split("x")
        flags: dict[str, int] = {}
        while fields and _flag(fields[-1]) and _flag(fields[-1])[0] not in flags:
            name, value = _flag(fields.pop())
            flags[name] = value
        try:
            numbers = [int(field) for field in fields]
        except ValueError:
            numbers = []
        heads = flags.get("k", 1)
        if (not 3 <= len(numbers) <= 5 or (len(numbers) == 5 and numbers[4] not in (0, 1, 2))
                or heads & (heads - 1) or ("w" in flags and "k" in flags)):
            raise ValueError(f"decode tile {text!r}: want block_n x warps x stages [x min_split_tokens "
                             "[x prefetch 0/1/2]] [x c] [x w | x k<power of two>] [x s] [x n<splits>]")
        tile = cls(*numbers[:4], fused_combine="c" not in flags, wide="w" in flags, kv_heads=heads,
                   speculate="s" in flags, splits=flags.get("n", 0))
        return replace(tile, prefetch=numbers[4]) if len(numbers) == 5 else tile

    @property
    def label(self) -> str:
        numbers = (self.block_n, self.num_warps, self.num_stages, self.min_split_tokens, self.prefetch)
        heads = f"xk{self.kv_heads}" if self.kv_heads > 1 and not self.wide else ""
        flags = ("" if self.fused_combine else "xc") + ("xw" if self.wide else "") + heads
        flags += ("xs" if self.speculate else "") + (f"xn{self.splits}" if self.splits else "")
        return "x".join(map(str, numbers)) + flags

    @property
    def min_split_tiles(self) -> int:
        return max(1, -(-self.min_split_tokens // self.block_n))

    def heads_per_program(self, num_kv_heads: int) -> int:
        """Key/value heads one program serves (a power of two, padded past `num_kv_heads`): all of them
        for a wide tile, else `kv_heads` but no more than the padded head count."""
        padded = _power_of_two(num_kv_heads)
        return padded if self.wide else min(_power_of_two(self.kv_heads), padded)


def _flag(field: str) -> tuple[str, int] | None:
    """A tile string's trailing flag: ("c", 1), ("w", 1), ("s", 1), ("k", N) for ``kN``, ("n", N) for
    ``nN``; None for a number."""
    if field in ("c", "w", "s"):
        return field, 1
    if len(field) > 1 and field[0] in "kn" and field[1:].isdigit() and int(field[1:]) > 0:
        return field[0], int(field[1:])
    return None


DEFAULT_TILE = DecodeTile()
# Measured tiles by (head_dim, largest decode batch of the bucket); absent keys use DEFAULT_TILE.
# Fill from `bench/decode_attention.py` (its "suggested tiles" lines) on the serving device class.
# H200, Llama-8B shapes (bench/results/h200_decode_gpu_call1/decode_attention.log, summed over contexts
# 128-1,024, the served split rule): batch 1 with 128-position tiles of 8 warps and the speculative first
# page entries (1.00-1.03x the same tile without); batch 64 the default tile, speculative (1.01-1.04x);
# batch 256 programs of 4 key/value heads on 16-position tiles (1.03-1.05x the default, 1.10-1.12x the
# kernel before this table); a second call (h200_decode_gpu_call2) confirmed them against the previous
# tiles: 1.00-1.01x, 1.02x, 1.03-1.05x. PREFILL_TILES' suggestion there is its default.
DECODE_TILES: dict[tuple[int, int], DecodeTile] = {
    (128, 1): DecodeTile(128, 8, 2, 128, speculate=True),
    (128, 64): DecodeTile(64, 4, 2, 128, speculate=True),
    (128, 256): DecodeTile(16, 4, 2, 128, kv_heads=4),
}
_BATCH_BUCKETS = (1, 16, 64, 256)


def decode_tile(num_tokens: int, head_dim: int) -> DecodeTile:
    """The tile for a decode launch of `num_tokens` tokens at `head_dim`, from static numbers only."""
    bucket = next((b for b in _BATCH_BUCKETS if num_tokens <= b), _BATCH_BUCKETS[-1])
    return DECODE_TILES.get((head_dim, bucket), DEFAULT_TILE)


def _power_of_two(n: int) -> int:
    """The least power of two >= n (1 for n <= 1)."""
    return 1 << max(n - 1, 0).bit_length()
