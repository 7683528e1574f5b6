"""The generic captured programs: one `torch.nn.Module` per operation family, built from an Architecture.

The forward signatures are the calling convention declared by `program_spec.ProgramSpec` (capture
checks that the parameter names equal the spec's input names). PREFILL, DECODE and MIXED share one
graph shape: rows of any query length packed into T tokens; they differ only in capacity. Every
program ends with the ABI sampling op on the last packed token of each row; SCORED_PREFILL also
returns the log-probability of given target tokens at every packed position.

Mutation: k_cache and v_cache (this step's keys/values, through ``helios::cache_write``) and
output_counts (one count per sampled row, ``index_put_`` with accumulation) are written in place.
Nothing else that is passed in is modified.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

import helios.abi.sampling  # noqa: F401  (registers helios::sample)
from helios.ignition.architecture import Architecture, weight_layout
from helios.ignition.decoder import PackedStep, decoder_hidden, lm_logits, slot_mapping


class SamplingInputs(NamedTuple):
    """Per-row sampling controls, in the argument order of ``helios::sample``."""

    seeds: torch.Tensor
    counters: torch.Tensor
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    penalties: torch.Tensor


class GenerationProgram(torch.nn.Module):
    """PREFILL, DECODE and MIXED: run the packed tokens, sample one token per sampling row."""

    def __init__(self, arch: Architecture, page_tokens: int):
        super().__init__()
        self.arch = arch
        self.page_tokens = page_tokens
        self.weight_names = tuple(slot.name for slot in weight_layout(arch))

    def forward(
        self, weights: list[torch.Tensor], k_cache, v_cache, prompt_counts, output_counts,
        token_ids, positions, query_start, page_table, request_slots, sample_rows,
        seeds, counters, temperature, top_k, top_p, min_p, penalties, grammar_mask, mask_rows,
    ):
        w = self.bind(weights)
        step = self.packed_step(token_ids, positions, query_start, page_table)
        hidden = decoder_hidden(self.arch, w, k_cache, v_cache, step)
        controls = SamplingInputs(seeds, counters, temperature, top_k, top_p, min_p, penalties)
        return self.sample(w, hidden, step, (prompt_counts, output_counts, request_slots, sample_rows),
                           controls, (grammar_mask, mask_rows))

    def bind(self, weights: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        if len(weights) != len(self.weight_names):
            raise ValueError(f"expected {len(self.weight_names)} weights, got {len(weights)}")
        return dict(zip(self.weight_names, weights))

    def packed_step(self, token_ids, positions, query_start, page_table) -> PackedStep:
        slots = slot_mapping(query_start, page_table, positions, self.page_tokens)
        return PackedStep(token_ids, positions, query_start, page_table, slots)

    def sample(self, w, hidden, step: PackedStep, state, controls: SamplingInputs, grammar):
        """Sample each row's next token from its last packed token; count it in output_counts."""
        prompt_counts, output_counts, request_slots, sample_rows = state
        last = (step.query_start[1:] - 1).clamp(min=0).to(torch.int64)
        logits = lm_logits(self.arch, w, hidden[last])
        slots = request_slots.clamp(min=0)
        sampled = torch.ops.helios.sample(
            logits, *controls, prompt_counts[slots], output_counts[slots], grammar[0], grammar[1]
        )
        sampled = torch.where(sample_rows, sampled, torch.full_like(sampled, -1))
        counted = (sampled >= 0).to(output_counts.dtype)  # NO_TOKEN (-1) rows count nothing
        output_counts.index_put_((slots, sampled.clamp(min=0)), counted, accumulate=True)
        return sampled, logits


class ScoredPrefillProgram(GenerationProgram):
    """SCORED_PREFILL: a prefill that also scores target_ids at every packed position."""

    def forward(
        self, weights: list[torch.Tensor], k_cache, v_cache, prompt_counts, output_counts,
        token_ids, positions, query_start, page_table, request_slots, sample_rows,
        seeds, counters, temperature, top_k, top_p, min_p, penalties, grammar_mask, mask_rows, target_ids,
    ):
        w = self.bind(weights)
        step = self.packed_step(token_ids, positions, query_start, page_table)
        hidden = decoder_hidden(self.arch, w, k_cache, v_cache, step)
        controls = SamplingInputs(seeds, counters, temperature, top_k, top_p, min_p, penalties)
        sampled, logits = self.sample(w, hidden, step, (prompt_counts, output_counts, request_slots, sample_rows),
                                      controls, (grammar_mask, mask_rows))
        return sampled, logits, self.target_logprobs(w, hidden, step, target_ids)

    def target_logprobs(self, w, hidden, step: PackedStep, target_ids) -> torch.Tensor:
        logprobs = torch.log_softmax(lm_logits(self.arch, w, hidden), dim=-1)
        scored = logprobs.gather(1, target_ids.clamp(min=0)[:, None]).squeeze(1)
        return torch.where(step.slot_mapping >= 0, scored, torch.zeros_like(scored))
