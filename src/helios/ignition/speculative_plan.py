"""Which SPECULATIVE variants a core captures, and the draft model they propose with.

`SpeculativePlan` names the draft checkpoint (a smaller model with the target's vocabulary,
prepared into the same core) and the variants: for each batch capacity B and width W, D = W - 1
proposal draws unless `draft_tokens` sets D for every wider width (D is never inferred beyond
that: a confidence-allocating plan may draw more than it verifies), and P = B x W unless
`packed_per_lane` sets a smaller packed capacity. Width one always means D = 0.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from safetensors.torch import save as save_safetensors

from helios.ignition.architecture import Architecture, CheckpointError
from helios.ignition.program_spec import (
    DRAFT_PREFIX,
    MAX_BATCH_CAPACITY,
    MAX_VERIFY_TOKENS,
    Capacity,
    Operation,
    ProgramOptions,
)
from helios.ignition.recipes import Recipe, load_checkpoint

DRAFT_WEIGHTS_RESOURCE = "weights.draft.rank0"


@dataclass(frozen=True)
class SpeculativePlan:
    draft: Path
    widths: tuple[int, ...] = (1, 4)
    batches: tuple[int, ...] | None = None  # None: the decode batch capacities
    draft_tokens: int | None = None
    allocate_prefixes: bool = False
    packed_per_lane: int | None = None

    def __post_init__(self) -> None:
        if not self.widths or not 1 <= min(self.widths) <= max(self.widths) <= MAX_VERIFY_TOKENS:
            raise CheckpointError(f"speculative widths must lie between 1 and {MAX_VERIFY_TOKENS}")
        if self.batches is not None and (not self.batches or not 1 <= min(self.batches) <= max(self.batches)
                                         <= MAX_BATCH_CAPACITY):
            raise CheckpointError(f"speculative batch capacities must lie between 1 and {MAX_BATCH_CAPACITY}")
        if self.draft_tokens is not None and not 1 <= self.draft_tokens <= MAX_VERIFY_TOKENS:
            raise CheckpointError(f"draft_tokens must lie between 1 and {MAX_VERIFY_TOKENS}")
        if self.packed_per_lane is not None and self.packed_per_lane < 1:
            raise CheckpointError("packed_per_lane must be positive")

    def capacity(self, rows: int, width: int) -> Capacity:
        drafts = 0 if width == 1 else (self.draft_tokens or width - 1)
        per_lane = min(width, self.packed_per_lane or width)
        return Capacity(rows, rows * per_lane, width, drafts)

    def variants(self, decode_batches: tuple[int, ...]) -> list[tuple[Operation, Capacity]]:
        batches = sorted(set(self.batches or decode_batches))
        return [(Operation.SPECULATIVE, self.capacity(rows, width)) for width in sorted(set(self.widths))
                for rows in batches]

    def options(self, draft: Architecture) -> ProgramOptions:
        widest = max(self.capacity(1, width).lane_limit for width in self.widths)
        return ProgramOptions(draft=draft, record_tokens=widest if widest > 1 else 0,
                              allocates_prefixes=self.allocate_prefixes)


def load_draft(plan: SpeculativePlan, target: Architecture, context_tokens: int | None = None) -> Recipe:
    """The draft recipe in the target's dtype, for the target's served context (`load_checkpoint`);
    its vocabulary must be the target's."""
    draft = load_checkpoint(plan.draft, target.dtype, context_tokens)
    if draft.architecture.vocab_size != target.vocab_size:
        raise CheckpointError(
            f"the draft's vocabulary ({draft.architecture.vocab_size}) differs from the target's ({target.vocab_size})"
        )
    return draft  # with tensor parallelism every rank runs the whole draft (replicated)


def draft_weights_file(draft: Recipe) -> tuple[bytes, bytes]:
    """(safetensors bytes of the draft's weights under their manifest names, their sha256)."""
    data = save_safetensors({f"w.{DRAFT_PREFIX}{w.name}": w.tensor.contiguous() for w in draft.weights})
    return data, hashlib.sha256(data).digest()
