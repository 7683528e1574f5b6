"""The greedy sampling pass (`helios.abi.triton_sampling.greedy_tokens`) at the 8B vocabulary: the
float32 reduction of neutral rows against the float64 one (the kernel before it), and split counts,
in one process, each side in a CUDA graph (device ms per call). Neutral penalties and no grammar
masks (the anchor's greedy rows); then the same rows as a served step has them (every row masked
by an all-allowing mask; and with the counts read through slots, half the rows padding). Every
variant's tokens are checked against the default's.

    python bench/greedy_ab.py [--rows 1,64,256] [--vocab 128256]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lever_ab import graph_ms  # noqa: E402

from helios.abi.triton_sampling import greedy_splits, greedy_tokens  # noqa: E402

DEVICE = "cuda"  # (a CPU check of the script sets "cpu" under the Triton interpreter)


def inputs(rows: int, vocab: int) -> list[torch.Tensor]:
    logits = torch.randn(rows, vocab, device=DEVICE) * 3
    penalties = torch.tensor([[1.0, 0.0, 0.0]], device=DEVICE).repeat(rows, 1)
    counts = torch.zeros(rows, vocab, dtype=torch.int32, device=DEVICE)
    mask = torch.zeros(rows, -(-vocab // 32), dtype=torch.int32, device=DEVICE)
    return [logits, penalties, counts, counts, mask, torch.zeros(rows, dtype=torch.bool, device=DEVICE)]


def greedy_ab(rows_list, vocab: int, log) -> list[dict]:
    results = []
    for rows in rows_list:
        arguments = inputs(rows, vocab)
        default = greedy_splits(rows, vocab)
        expected = greedy_tokens(*arguments)
        row = {"rows": rows, "default_splits": default, "variants": {}}
        variants = [("float64 (before)", False, default), ("float32", True, default)]
        variants += [(f"float32, {s} splits", True, s) for s in (default * 2, default * 4, default * 8) if s <= 256]
        for label, plain, splits in variants:
            got = greedy_tokens(*arguments, plain_f32=plain, splits=splits)
            if not torch.equal(got, expected):
                log(f"greedy R={rows} {label}: tokens differ from the default's")
                continue
            row["variants"][label] = graph_ms(lambda p=plain, s=splits: greedy_tokens(*arguments, plain_f32=p, splits=s))
        # As served: every row masked by an all-allowing mask (the programs mask every row), counts
        # read through the slots (`helios.abi.sampling_rows`), padding rows (slot -1) past half the rows.
        served = [*arguments[:4], torch.full_like(arguments[4], -1), torch.ones_like(arguments[5])]
        slots = torch.arange(rows, device=DEVICE)
        slots[max(1, rows // 2):] = -1
        for label, row_slots in (("float32, served masks", None), ("float32, served masks, half padding", slots)):
            got = greedy_tokens(*served, row_slots=row_slots)
            live = slots >= 0 if row_slots is not None else slice(None)
            if not torch.equal(got[live], expected[live]):
                log(f"greedy R={rows} {label}: tokens differ from the default's")
                continue
            row["variants"][label] = graph_ms(lambda r=row_slots: greedy_tokens(*served, row_slots=r))
        before = row["variants"].get("float64 (before)", float("nan"))
        log(f"greedy R={rows} ({default} splits by default): " + ", ".join(
            f"{label} {ms:.4f} ms ({before / ms:.2f}x)" for label, ms in row["variants"].items()))
        results.append(row)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,64,256")
    parser.add_argument("--vocab", type=int, default=128256)
    arguments = parser.parse_args()
    greedy_ab([int(r) for r in arguments.rows.split(",")], arguments.vocab, lambda line: print(line, flush=True))
