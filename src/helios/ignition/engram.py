"""Engram n-gram embedding tables beside a checkpoint: the file format, its validation, and what
the programs of an Engram core add.

Format: ``engram.safetensors`` in the checkpoint directory holds

* ``engram.table`` [rows, width], float32, float16 or bfloat16: the hashed n-gram embeddings. It
  stays in host memory when served (a PLACEMENT_HOST WEIGHT buffer of the core's host table); the
  runtime stages the rows every packed token selects (`helios.runtime.execution.host_staging`);
* ``engram.proj`` [hidden, heads * width], the same dtypes: projects a token's staged rows (its
  heads' rows, concatenated head-major) into the model's hidden width;

and string metadata (the safetensors header's ``__metadata__``): ``ngram_tokens`` (n >= 1),
``heads`` (>= 1) and ``multipliers``: heads x n comma-separated decimal odd 64-bit multipliers,
head-major. The row of head h for the token at position p is the specification's hash:
``XOR over i < n of ((token[p - i] + 1, or 0 before the sequence) * multipliers[h * n + i]) mod 2^64``,
modulo ``rows``.

Model: a token's input embedding becomes ``embed[t] + proj @ concat_h(table[row_h(p)])``; every
decoder layer after it is the checkpoint's. ``embed[t]`` is the reference's input embedding (Gemma's
scaled lookup); where the reference scales its ``inputs_embeds`` after the lookup, the sum is scaled
(Granite's embedding_multiplier, folded into ``proj`` at preparation: `Recipe.inputs_embeds_scale`).
Every token's rows are hashed on the host, so an Engram
core's programs take host-known tokens only: DECODE is fed by the host (no device-owned pending
tokens) and there are no speculative programs. A bad table raises `EngramTableError` naming what is
wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from helios.ignition.architecture import CheckpointError
from helios.ignition.recipes.checkpoint import checked_tensor, is_finite

ENGRAM_FILE = "engram.safetensors"
TABLE, PROJ = "engram.table", "engram.proj"
ROWS_INPUT = "engram_rows"  # the programs' staged-rows input [T, heads, width]
HOST_TABLE = "engram"  # the contract's host table name
_FLOATS = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
MASK64 = (1 << 64) - 1


class EngramTableError(CheckpointError):
    """An n-gram embedding table file that breaks the format (module docstring)."""


@dataclass(frozen=True)
class EngramOptions:
    """What the programs of an Engram core take: rows [T, heads, width] of `dtype`."""

    heads: int
    width: int
    dtype: str


@dataclass(frozen=True)
class EngramTable:
    table: torch.Tensor  # [rows, width]
    proj: torch.Tensor  # [hidden, heads * width]
    ngram_tokens: int
    heads: int
    multipliers: tuple[int, ...]

    @property
    def options(self) -> EngramOptions:
        return EngramOptions(self.heads, self.table.shape[1], _FLOATS[self.table.dtype])

    def rows_at(self, tokens, position: int) -> list[int]:
        """The table row of each head for the n-gram ending at `position` (the hash above)."""
        out = []
        for head in range(self.heads):
            key = 0
            for i in range(self.ngram_tokens):
                p = position - i
                key ^= (((tokens[p] + 1) if p >= 0 else 0) * self.multipliers[head * self.ngram_tokens + i]) & MASK64
            out.append(key % self.table.shape[0])
        return out


def read_engram(checkpoint: Path, hidden_size: int, dtype: str) -> EngramTable | None:
    """The checkpoint's table (None without ``engram.safetensors``), cast to the model's `dtype`."""
    path = Path(checkpoint) / ENGRAM_FILE
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as handle:
            names = set(handle.keys())
            missing = sorted({TABLE, PROJ} - names)
            if missing:
                raise EngramTableError(f"{ENGRAM_FILE}: missing tensors {missing}")
            metadata = handle.metadata() or {}
            # Headers first, as the checkpoint's weights: a sparse file claiming a table of terabytes
            # was read in full (the process killed for memory) before its shape was checked.
            table, proj = checked_tensor(handle, path, TABLE), checked_tensor(handle, path, PROJ)
    except EngramTableError:
        raise
    except CheckpointError as error:  # checked_tensor's: an integer tensor, or one past the memory available
        raise EngramTableError(str(error)) from None
    except Exception as error:  # safetensors raises its own errors for a malformed file
        raise EngramTableError(f"{ENGRAM_FILE} is not a readable safetensors file: {error}") from None
    ngram, heads, multipliers = _metadata(metadata)
    for name, tensor in ((TABLE, table), (PROJ, proj)):
        if tensor.dtype not in _FLOATS or tensor.dim() != 2:
            raise EngramTableError(f"{ENGRAM_FILE}: {name} must be a 2-D float32/float16/bfloat16 tensor, "
                                   f"got {tuple(tensor.shape)} {tensor.dtype}")
        if not is_finite(tensor):
            raise EngramTableError(f"{ENGRAM_FILE}: {name} holds NaN or infinite values")
    rows, width = table.shape
    if rows < 1 or width < 1:
        raise EngramTableError(f"{ENGRAM_FILE}: {TABLE} is empty ({rows} x {width})")
    if tuple(proj.shape) != (hidden_size, heads * width):
        raise EngramTableError(f"{ENGRAM_FILE}: {PROJ} is {tuple(proj.shape)}; the model needs "
                               f"[{hidden_size}, heads * width] = [{hidden_size}, {heads * width}]")
    cast = getattr(torch, dtype)
    return EngramTable(table.to(cast).contiguous(), proj.to(cast).contiguous(), ngram, heads, multipliers)


def _metadata(metadata: dict) -> tuple[int, int, tuple[int, ...]]:
    values = {}
    for key in ("ngram_tokens", "heads", "multipliers"):
        if key not in metadata:
            raise EngramTableError(f"{ENGRAM_FILE}: metadata {key!r} is missing")
    for key in ("ngram_tokens", "heads"):
        text = metadata[key]
        if not text.isdigit() or int(text) < 1:
            raise EngramTableError(f"{ENGRAM_FILE}: metadata {key!r} must be a positive integer, got {text!r}")
        values[key] = int(text)
    try:
        multipliers = tuple(int(item) for item in metadata["multipliers"].split(","))
    except ValueError:
        raise EngramTableError(f"{ENGRAM_FILE}: metadata 'multipliers' must be comma-separated integers") from None
    wanted = values["ngram_tokens"] * values["heads"]
    if len(multipliers) != wanted:
        raise EngramTableError(f"{ENGRAM_FILE}: {len(multipliers)} multipliers; heads x ngram_tokens is {wanted}")
    bad = [m for m in multipliers if not 0 < m <= MASK64 or m % 2 == 0]
    if bad:
        raise EngramTableError(f"{ENGRAM_FILE}: multipliers must be odd 64-bit integers, got {bad[0]}")
    return values["ngram_tokens"], values["heads"], multipliers


def write_engram(directory: Path, table: torch.Tensor, proj: torch.Tensor, ngram_tokens: int,
                 multipliers: tuple[int, ...]) -> Path:
    """Writes ``engram.safetensors`` in the format above (heads = len(multipliers) / ngram_tokens)."""
    from safetensors.torch import save_file

    heads = len(multipliers) // ngram_tokens
    metadata = {"ngram_tokens": str(ngram_tokens), "heads": str(heads),
                "multipliers": ",".join(str(m) for m in multipliers)}
    path = Path(directory) / ENGRAM_FILE
    save_file({TABLE: table.contiguous(), PROJ: proj.contiguous()}, str(path), metadata=metadata)
    return path


def engram_embedding(proj: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """[T, hidden]: each packed token's staged rows [T, heads, width] through the projection."""
    return rows.reshape(rows.shape[0], -1).to(proj.dtype) @ proj.T


