"""Tile configurations of the Triton expert kernels (`helios.abi.triton_moe`), tuned per shape.

A kernel launch's tiles (rows per block, column and reduction tiles, warps, pipeline stages) are
chosen from a table keyed by the launch's shape: the kernel path (``gemv`` for the small-batch
matrix-vector kernels, ``grouped`` for the sorted block GEMM), the assignment bucket (token-expert
assignments A = T * K rounded up to a power of two), the expert count E, hidden width H,
intermediate width F and the weights' dtype. ``moe_tiles.json`` beside this module holds the table
`bench/tune_moe.py` writes on the device; a shape it does not list takes the defaults below (the
tiles the kernels used before tuning), so an empty or missing table changes nothing.

The choice is a pure function of static shapes: a captured program replays the same tiles.
Loading is lazy and once per process; a malformed table raises `TileTableError` naming the entry.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

__all__ = ["KernelTiles", "LaunchTiles", "TileTableError", "ShapeKey", "TABLE_PATH", "default_tiles", "load_table",
           "shape_key", "tiles_for"]

TABLE_PATH = Path(__file__).with_name("moe_tiles.json")
PATHS = ("gemv", "grouped")
_POWERS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class TileTableError(ValueError):
    """The tuned tile table is malformed (unknown path, non power-of-two tiles, missing fields)."""


@dataclass(frozen=True)
class KernelTiles:
    """Tiles of one kernel launch. `block_m` is unused by the gemv path (one assignment per program)."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if name == "num_stages":
                if not 1 <= value <= 8:
                    raise TileTableError(f"num_stages {value} is outside 1..8")
            elif value not in _POWERS and not (name.startswith("block") and value in (512, 1024)):
                raise TileTableError(f"{name} {value} is not a power of two in range")


@dataclass(frozen=True)
class LaunchTiles:
    """The tiles of a path's two kernels: gate/up (intermediate columns) and down (hidden columns)."""

    gate_up: KernelTiles
    down: KernelTiles


@dataclass(frozen=True)
class ShapeKey:
    path: str
    assignments: int  # bucket: the next power of two >= A
    num_experts: int
    hidden: int
    intermediate: int
    dtype: str  # torch dtype name without the module, "bfloat16"

    def text(self) -> str:
        return f"{self.path}/A{self.assignments}/E{self.num_experts}/H{self.hidden}/F{self.intermediate}/{self.dtype}"


def _bucket(assignments: int) -> int:
    return 1 << max(0, (assignments - 1).bit_length())


def shape_key(path: str, assignments: int, num_experts: int, hidden: int, intermediate: int, dtype) -> ShapeKey:
    if path not in PATHS:
        raise TileTableError(f"unknown kernel path {path!r}; expected one of {PATHS}")
    name = str(dtype).removeprefix("torch.")
    return ShapeKey(path, _bucket(assignments), num_experts, hidden, intermediate, name)


def default_tiles(path: str, assignments: int, num_experts: int) -> LaunchTiles:
    """The untuned tiles: gemv 32 x 128 columns x reduction; grouped rows per block from the mean rows
    per expert (16 while experts see a few rows each, up to 64), 32 or 64 columns, 64 reduction."""
    if path == "gemv":
        tiles = KernelTiles(1, 32, 128, 4, 2)
        return LaunchTiles(tiles, tiles)
    mean_rows = assignments / max(1, num_experts)
    rows = 16 if mean_rows <= 24 else 32 if mean_rows <= 48 else 64
    tiles = KernelTiles(rows, 32 if assignments <= 64 else 64, 64, 4, 2)
    return LaunchTiles(tiles, tiles)


def _parse_entry(text: str, entry) -> tuple[ShapeKey, LaunchTiles]:
    try:
        path, a, e, h, f, dtype = text.split("/")
        key = ShapeKey(path, int(a[1:]), int(e[1:]), int(h[1:]), int(f[1:]), dtype)
        if path not in PATHS or not (a[0], e[0], h[0], f[0]) == ("A", "E", "H", "F"):
            raise ValueError("malformed key")
        tiles = LaunchTiles(KernelTiles(**entry["gate_up"]), KernelTiles(**entry["down"]))
        if path == "grouped":
            _check_grouped(tiles)
        return key, tiles
    except TileTableError as error:
        raise TileTableError(f"tile table entry {text!r}: {error}") from None
    except (ValueError, KeyError, TypeError) as error:
        raise TileTableError(f"tile table entry {text!r} is malformed: {error}") from None


def _check_grouped(tiles: LaunchTiles) -> None:
    """The two grouped kernels share one block schedule (one rows-per-block), and tensor-core dots
    need tiles of at least 16."""
    if tiles.gate_up.block_m != tiles.down.block_m:
        raise TileTableError(f"grouped kernels need one block_m, got {tiles.gate_up.block_m} and {tiles.down.block_m}")
    for kernel in (tiles.gate_up, tiles.down):
        if min(kernel.block_m, kernel.block_n, kernel.block_k) < 16:
            raise TileTableError(f"grouped tiles must be at least 16, got {kernel}")


def load_table(path: Path = TABLE_PATH) -> dict[ShapeKey, LaunchTiles]:
    """The table at `path` (``{"entries": {KEY: {"gate_up": tiles, "down": tiles}}}``); empty if absent."""
    if not path.exists():
        return {}
    try:
        document = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise TileTableError(f"{path}: not JSON: {error}") from None
    entries = document.get("entries") if isinstance(document, dict) else None
    if not isinstance(entries, dict):
        raise TileTableError(f"{path}: expected an object with an 'entries' object")
    return dict(_parse_entry(text, entry) for text, entry in entries.items())


@lru_cache(maxsize=1)
def _table() -> dict[ShapeKey, LaunchTiles]:
    return load_table()


def tiles_for(path: str, assignments: int, num_experts: int, hidden: int, intermediate: int, dtype,
              table: dict[ShapeKey, LaunchTiles] | None = None) -> LaunchTiles:
    """The tuned tiles of this launch shape, or the defaults when the table does not list it."""
    key = shape_key(path, assignments, num_experts, hidden, intermediate, dtype)
    found = (_table() if table is None else table).get(key)
    return found if found is not None else default_tiles(path, assignments, num_experts)


def table_document(entries: dict[ShapeKey, LaunchTiles]) -> dict:
    """The JSON document `load_table` reads back (sorted keys: stable diffs)."""
    return {"entries": {key.text(): {"gate_up": asdict(t.gate_up), "down": asdict(t.down)}
                        for key, t in sorted(entries.items(), key=lambda item: item[0].text())}}
