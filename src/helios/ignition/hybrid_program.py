"""The captured programs of a hybrid decoder (`Architecture.recurrent`): PREFILL, DECODE and MIXED.

They keep the generic programs' calling convention (`helios.ignition.program`) and add two trailing
inputs, last: ``conv_state`` and ``ssm_state`` (the mixers' state rows; cache storage of a RECURRENT
history region, sized by state rows). A row advances the state rows of its request slot; a row
whose first packed token is position 0 starts from zero state, so a slot reused by a new request,
a recomputed prompt or a restored snapshot (state copied into the slot's rows by the runtime
before the step, first position > 0) needs no other signal. DECODE rows carry one token each, so
the state ops run one step; PREFILL and MIXED run up to their packed token capacity.

Hybrid cores have no draft model (no SPECULATIVE programs) and no SCORED_PREFILL program.
"""

from __future__ import annotations

import torch

from helios.ignition.architecture import Architecture, CheckpointError
from helios.ignition.hybrid_decoder import HybridStorage, hybrid_hidden, row_state
from helios.ignition.program import (
    DecodeProgram, GenerationProgram, MixedProgram, TunedDecodeProgram, store_pending,
)
from helios.ignition.program_spec import Capacity, Operation, ProgramOptions

RECURRENT_INPUTS = ("conv_state", "ssm_state")


class _Recurrent:
    """Replaces the decoder forward of a generic program with the hybrid one; the trailing inputs
    the generic program would treat as the draft's are the mixers' state planes."""

    arch: Architecture
    one_token_rows = False

    def _add_recurrent_inputs(self) -> None:
        self.trailing_input_names = (*self.trailing_input_names, *RECURRENT_INPUTS)

    def run(self, weights, k_cache, v_cache, counts, step, lanes, controls, draft=(), pending=None):
        conv_state, ssm_state = draft
        w = self.bind(weights, step, lanes[0], ())
        max_query_len = 1 if self.one_token_rows else step.token_ids.shape[0]
        state = row_state(step, lanes[0], max_query_len)
        storage, last = HybridStorage(k_cache, v_cache, conv_state, ssm_state), self.last_tokens(step)
        if self.last_rows_only:
            hidden = hybrid_hidden(self.arch, w, storage, step, state, last)
        else:
            hidden = hybrid_hidden(self.arch, w, storage, step, state)[last]
        sampled, logits, scores = self.sample(w, hidden, step, counts, lanes, controls)
        if pending is not None:
            store_pending(pending, lanes[0], sampled)
        return self.completion(step, lanes, sampled), logits, *scores


class HybridPrefillProgram(_Recurrent, GenerationProgram):
    def __init__(self, arch: Architecture, page_tokens: int, options: ProgramOptions = ProgramOptions()):
        super().__init__(arch, page_tokens, options)
        self._add_recurrent_inputs()


class HybridMixedProgram(_Recurrent, MixedProgram):
    def __init__(self, arch: Architecture, page_tokens: int, options: ProgramOptions = ProgramOptions()):
        super().__init__(arch, page_tokens, options)
        self._add_recurrent_inputs()


class HybridDecodeProgram(_Recurrent, DecodeProgram):
    one_token_rows = True

    def __init__(self, arch: Architecture, page_tokens: int, options: ProgramOptions = ProgramOptions()):
        super().__init__(arch, page_tokens, options)
        self._add_recurrent_inputs()


class HybridTunedDecodeProgram(_Recurrent, TunedDecodeProgram):
    one_token_rows = True

    def __init__(self, arch: Architecture, page_tokens: int, options: ProgramOptions, rows: int):
        super().__init__(arch, page_tokens, options, rows)
        self._add_recurrent_inputs()


def build_hybrid_program(arch: Architecture, operation: Operation, page_tokens: int, options: ProgramOptions,
                         capacity: Capacity | None) -> torch.nn.Module:
    """The module of `operation` for a hybrid Architecture (see the module docstring)."""
    if options.draft is not None:
        raise CheckpointError("hybrid recurrent decoders take no draft model")
    if operation is Operation.DECODE and options.attention_tuning is not None:
        if capacity is None:
            raise ValueError("a tuned DECODE program is built for one capacity")
        return HybridTunedDecodeProgram(arch, page_tokens, options, capacity.batch_capacity)
    builders = {Operation.PREFILL: HybridPrefillProgram, Operation.MIXED: HybridMixedProgram,
                Operation.DECODE: HybridDecodeProgram}
    if operation not in builders:
        raise CheckpointError(f"hybrid recurrent decoders have no {operation.value} program")
    return builders[operation](arch, page_tokens, options)
