"""Startup tuning producers: captured TUNING programs whose selection logic is program logic.

``tune_attention`` (the one producer today) fills ``attention_splits`` int32 [n], one entry per DECODE
variant in `AttentionTuning.decode_rows` order, with the decode split count of that variant::

    splits[i] = clamp(ceil(P * multiprocessors / (rows[i] * num_kv_heads)), 1, min(MAX, ceil(context / MIN)))

where ``multiprocessors`` is ``helios::device_multiprocessors`` of the buffer's device (CUDA: the
device's multiprocessor count; CPU: torch's thread count), num_kv_heads the rank's key/value heads, and
P, MAX and MIN `helios.abi.attention`'s DECODE_PROGRAMS_PER_MULTIPROCESSOR, DECODE_MAX_SPLITS and
MIN_SPLIT_TOKENS. The runtime runs the producer once after allocating
buffers and before capturing or exposing the serving graphs; DECODE programs then pass their entry
to ``helios::paged_attention_tuned``. The count is a schedule, so any value gives the same tokens.

Mutation: the producer writes ``attention_splits`` in place and nothing else.
"""

from __future__ import annotations

import torch

import helios.abi.tuning  # noqa: F401  (registers helios::device_multiprocessors)
from helios.abi.attention import DECODE_MAX_SPLITS, DECODE_PROGRAMS_PER_MULTIPROCESSOR, MIN_SPLIT_TOKENS
from helios.ignition.architecture import Architecture
from helios.ignition.program_spec import AttentionTuning, Capacity, Operation

TUNING_GRAPH = "tune_attention"
TUNING_CAPACITY = Capacity(1, 1)  # a producer serves no rows; the contract still names one variant


def attention_split_counts(multiprocessors: torch.Tensor, decode_rows: tuple[int, ...], num_kv_heads: int,
                           context_tokens: int) -> torch.Tensor:
    """int32 [len(decode_rows)] split counts from `multiprocessors` (int32 [1]), as tensor ops."""
    ceiling = max(1, min(DECODE_MAX_SPLITS, -(-context_tokens // MIN_SPLIT_TOKENS)))
    wanted = []
    for rows in decode_rows:
        programs = max(1, rows * num_kv_heads)
        wanted.append(torch.div(multiprocessors * DECODE_PROGRAMS_PER_MULTIPROCESSOR + (programs - 1), programs, rounding_mode="floor"))
    return torch.cat(wanted).clamp(1, ceiling).to(torch.int32)


class AttentionTuningProgram(torch.nn.Module):
    """TUNING ``tune_attention``: ``forward(weights, attention_splits)`` fills attention_splits."""

    operation = Operation.TUNING

    def __init__(self, arch: Architecture, tuning: AttentionTuning):
        super().__init__()
        self.num_kv_heads = arch.num_kv_heads
        self.tuning = tuning

    def forward(self, weights: list[torch.Tensor], attention_splits: torch.Tensor):
        multiprocessors = torch.ops.helios.device_multiprocessors(attention_splits)
        counts = attention_split_counts(multiprocessors, self.tuning.decode_rows, self.num_kv_heads,
                                        self.tuning.context_tokens)
        attention_splits.copy_(counts)
        return ()
