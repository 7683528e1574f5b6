"""The captured programs of a vision-language core (calling convention: `multimodal_spec`).

VISION runs the recipe's encoder (`recipes.vision.vision_features`) over one patch capacity.
PREFILL and MIXED are the generic programs with image features scattered at the tokens that
``image_feature_indices`` names and mrope rotary positions (sequence position plus
``rotary_offsets``); each row then stores its last token's offset in ``rotary_deltas[slot]``.
DECODE (tuned or not, device-owned pending tokens or not) rotates a generated token by its sequence
position plus its slot's delta. Sampling, cache writes and completion records are the generic ones.
"""

from __future__ import annotations

import torch

from helios.ignition.architecture import Architecture
from helios.ignition.decoder import PackedStep
from helios.ignition.multimodal import multimodal_decoder_hidden
from helios.ignition.multimodal_spec import PROMPT_INPUTS, ROTARY_DELTAS
from helios.ignition.program import DecodeProgram, GenerationProgram, MixedProgram, TunedDecodeProgram
from helios.ignition.program_spec import Capacity, Operation, ProgramOptions, model_weight_layout
from helios.ignition.recipes.vision import vision_features


class VisionProgram(torch.nn.Module):
    """VISION: encoded features [P / merge^2, H] of one patch capacity's vision tensors."""

    def __init__(self, arch: Architecture, options: ProgramOptions):
        super().__init__()
        self.vision = options.multimodal.vision
        self.weight_names = tuple(s.name for s in model_weight_layout(arch, None, options.multimodal.extra_weights))

    def forward(self, weights: list[torch.Tensor], pixel_patches, rotary_positions, window_segments, image_segments,
                feature_order):
        w = {name: tensor for name, tensor in zip(self.weight_names, weights) if name.startswith("vision.")}
        return vision_features(self.vision, w, pixel_patches, rotary_positions, window_segments, image_segments,
                               feature_order)


def store_deltas(deltas: torch.Tensor, request_slots, query_lens, last_offsets: torch.Tensor) -> None:
    """deltas[slot] = the offset of the row's last packed token, for rows with tokens (padding
    rows add nothing: an accumulated difference, as `program.store_pending`)."""
    slots = request_slots.clamp(min=0)
    change = torch.where(query_lens > 0, last_offsets - deltas[slots], torch.zeros_like(last_offsets))
    deltas.index_put_((slots,), change, accumulate=True)


class _PromptImages:
    """PREFILL/MIXED hidden states: features at their tokens, mrope positions from the offsets."""

    def last_hidden(self, w, k_cache, v_cache, step: PackedStep, extra) -> torch.Tensor:
        offsets, indices, features = extra
        rotary = step.positions[:, None] + offsets
        last = self.last_tokens(step)
        if self.last_rows_only:
            return multimodal_decoder_hidden(self.arch, w, k_cache, v_cache, step, rotary, features, indices, last)
        return multimodal_decoder_hidden(self.arch, w, k_cache, v_cache, step, rotary, features, indices)[last]

    def finish(self, step: PackedStep, lanes, offsets, deltas, result):
        request_slots, query_lens = lanes[0], lanes[3]
        store_deltas(deltas, request_slots, query_lens, offsets[self.last_tokens(step), 0])
        return result


class MultimodalPrefill(_PromptImages, GenerationProgram):
    def __init__(self, arch: Architecture, page_tokens: int, options: ProgramOptions):
        super().__init__(arch, page_tokens, options)
        self.trailing_input_names = PROMPT_INPUTS

    def forward(
        self, weights: list[torch.Tensor], k_cache, v_cache, output_counts, prompt_counts, page_table,
        token_ids, positions, query_lens, request_slots, generations, sample_rows, seeds, counters,
        sampling_params, grammar_mask, logit_bias_ids, logit_bias_values, submission, rotary_offsets, image_feature_indices, image_features,
        rotary_deltas,
    ):
        step = self.packed_step(token_ids, positions, query_lens, request_slots, page_table)
        lanes = (request_slots, generations, sample_rows, query_lens, submission)
        result = self.run(weights, k_cache, v_cache, (output_counts, prompt_counts), step, lanes,
                          (seeds, counters, sampling_params, grammar_mask, logit_bias_ids, logit_bias_values), (), None,
                          (rotary_offsets, image_feature_indices, image_features))
        return self.finish(step, lanes, rotary_offsets, rotary_deltas, result)


class MultimodalMixed(_PromptImages, MixedProgram):
    def __init__(self, arch: Architecture, page_tokens: int, options: ProgramOptions):
        super().__init__(arch, page_tokens, options)
        self.trailing_input_names = PROMPT_INPUTS

    def forward(
        self, weights: list[torch.Tensor], k_cache, v_cache, output_counts, prompt_counts, page_table,
        token_ids, positions, query_lens, request_slots, generations, sample_rows, seeds, counters,
        sampling_params, grammar_mask, logit_bias_ids, logit_bias_values, submission, pending_ids, rotary_offsets, image_feature_indices,
        image_features, rotary_deltas,
    ):
        step = self.packed_step(token_ids, positions, query_lens, request_slots, page_table)
        step = step._replace(token_ids=self.with_pending(step, pending_ids))
        lanes = (request_slots, generations, sample_rows, query_lens, submission)
        result = self.run(weights, k_cache, v_cache, (output_counts, prompt_counts), step, lanes,
                          (seeds, counters, sampling_params, grammar_mask, logit_bias_ids, logit_bias_values), (), None,
                          (rotary_offsets, image_feature_indices, image_features))
        return self.finish(step, lanes, rotary_offsets, rotary_deltas, result)


class _DecodeDeltas:
    """DECODE: ``rotary_deltas`` is the last trailing input; rotary = position + the slot's delta."""

    def add_deltas_input(self) -> None:
        self.trailing_input_names = (*self.trailing_input_names, ROTARY_DELTAS)

    def decode(self, weights, k_cache, v_cache, counts, step: PackedStep, lanes, controls, trailing, extra=None):
        deltas, trailing = trailing[-1], trailing[:-1]
        rotary = (step.positions + deltas[lanes[0].clamp(min=0)])[:, None].expand(-1, 3)
        return super().decode(weights, k_cache, v_cache, counts, step, lanes, controls, trailing, rotary)

    def last_hidden(self, w, k_cache, v_cache, step: PackedStep, extra) -> torch.Tensor:
        return multimodal_decoder_hidden(self.arch, w, k_cache, v_cache, step, extra)[self.last_tokens(step)]


class MultimodalDecode(_DecodeDeltas, DecodeProgram):
    def __init__(self, arch: Architecture, page_tokens: int, options: ProgramOptions):
        super().__init__(arch, page_tokens, options)
        self.add_deltas_input()


class MultimodalTunedDecode(_DecodeDeltas, TunedDecodeProgram):
    def __init__(self, arch: Architecture, page_tokens: int, options: ProgramOptions, rows: int):
        super().__init__(arch, page_tokens, options, rows)
        self.add_deltas_input()


def build_multimodal(arch: Architecture, operation: Operation, page_tokens: int, options: ProgramOptions,
                     capacity: Capacity | None) -> torch.nn.Module:
    """The eager module of `operation` in a vision-language core (spec: `multimodal_spec`)."""
    if operation is Operation.VISION:
        return VisionProgram(arch, options)
    if operation is Operation.PREFILL:
        return MultimodalPrefill(arch, page_tokens, options)
    if operation is Operation.MIXED:
        return MultimodalMixed(arch, page_tokens, options)
    if operation is Operation.DECODE and options.attention_tuning is not None:
        if capacity is None:
            raise ValueError("a tuned DECODE program is built for one capacity")
        return MultimodalTunedDecode(arch, page_tokens, options, capacity.batch_capacity)
    if operation is Operation.DECODE:
        return MultimodalDecode(arch, page_tokens, options)
    raise ValueError(f"a vision-language core has no {operation.value} program")
