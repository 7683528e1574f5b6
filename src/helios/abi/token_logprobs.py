"""``helios::token_logprobs``: log-probabilities of chosen tokens and the top alternatives.

Signature (R rows, V vocabulary columns, K = ``num_top`` alternatives, 0 <= K <= MAX_TOP)::

    helios::token_logprobs(Tensor logits,        float32 [R, V]
                           Tensor tokens,        int64 [R]     the chosen token per row (NO_TOKEN: none)
                           Tensor penalties,     float32 [R, 3]
                           Tensor prompt_counts, int32 [R, V]
                           Tensor output_counts, int32 [R, V]
                           Tensor grammar_mask,  int32 [R, ceil(V / 32)]
                           Tensor mask_rows,     bool [R]
                           int num_top)
        -> (Tensor chosen,      float32 [R]     log p(token); -inf for NO_TOKEN or a masked token
            Tensor top_ids,     int64 [R, K]    most probable ids, probability descending, id ascending on ties
            Tensor top_logprobs float32 [R, K])

The distribution is the one ``helios::sample`` draws from up to its step 4 (`helios.abi.sampling`):
float32 logits read as float64 (NaN -> -inf, +inf -> float32 max), repetition, frequency and
presence penalties, the grammar mask (disallowed tokens get -inf), then ``log_softmax`` in float64.
Temperature and the top-k/top-p/min-p filters are not applied: the values are those of the model's
distribution after penalties and masks, the same for every temperature, and for a greedy row
(temperature 0, no penalty, no mask) exactly ``log_softmax`` of the logits, with the chosen token
its argmax. A row whose every token is masked gets -inf everywhere (its ids are then 0..K-1).

It is a separate op from ``helios::sample`` so that a program variant computes it only for steps
that hold a request asking for log-probabilities; requests without them pay nothing. Rows are
independent (batch-invariant), and the body reads no device data on the host, so it can be
captured in a CUDA graph.
"""

from __future__ import annotations

import torch

from helios.abi.grammar import check_mask_args, disallowed
from helios.abi.op_library import abi_op
from helios.abi.registry import AbiArgumentError, check_same_device, check_tensor
from helios.abi.sampling import NUM_PENALTIES, apply_penalties, row_blocks

MAX_TOP = 20  # OpenAI's top_logprobs bound
_OP = "helios::token_logprobs"
_SCHEMA = ("(Tensor logits, Tensor tokens, Tensor penalties, Tensor prompt_counts, Tensor output_counts, "
           "Tensor grammar_mask, Tensor mask_rows, int num_top) -> (Tensor, Tensor, Tensor)")
_NEG_INF = float("-inf")
_F32_MAX = torch.finfo(torch.float32).max


def check_logprob_args(logits, tokens, penalties, prompt_counts, output_counts, grammar_mask, mask_rows,
                       num_top: int) -> tuple[int, int]:
    num_rows, vocab_size = check_mask_args(_OP, logits, grammar_mask, mask_rows)
    if logits.dtype != torch.float32:
        raise AbiArgumentError(f"{_OP}: logits must be float32 [R, V], got {logits.dtype}")
    if not 0 <= num_top <= min(MAX_TOP, vocab_size):
        raise AbiArgumentError(f"{_OP}: num_top must lie in [0, {min(MAX_TOP, vocab_size)}], got {num_top}")
    check_tensor(_OP, "tokens", tokens, torch.int64, (num_rows,))
    check_tensor(_OP, "penalties", penalties, torch.float32, (num_rows, NUM_PENALTIES))
    check_tensor(_OP, "prompt_counts", prompt_counts, torch.int32, (num_rows, vocab_size))
    check_tensor(_OP, "output_counts", output_counts, torch.int32, (num_rows, vocab_size))
    check_same_device(_OP, {"logits": logits, "tokens": tokens, "penalties": penalties,
                            "prompt_counts": prompt_counts, "output_counts": output_counts})
    return num_rows, vocab_size


def logprobs_reference(logits, tokens, penalties, prompt_counts, output_counts, grammar_mask, mask_rows,
                       num_top: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The op's values on validated inputs (see the module docstring), computed in row blocks
    (`helios.abi.sampling.row_blocks`: the float64 temporaries stay small at any batch)."""
    blocks = [_logprobs_rows(logits[rows], tokens[rows], penalties[rows], prompt_counts[rows], output_counts[rows],
                             grammar_mask[rows], mask_rows[rows], num_top) for rows in row_blocks(*logits.shape)]
    if not blocks:
        return _logprobs_rows(logits, tokens, penalties, prompt_counts, output_counts, grammar_mask, mask_rows,
                              num_top)
    return tuple(torch.cat(parts) for parts in zip(*blocks))


def _logprobs_rows(logits, tokens, penalties, prompt_counts, output_counts, grammar_mask, mask_rows,
                   num_top: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    values = torch.nan_to_num(logits.to(torch.float64), nan=_NEG_INF, posinf=_F32_MAX, neginf=_NEG_INF)
    values = apply_penalties(values, penalties, prompt_counts, output_counts)
    values = values.masked_fill(disallowed(grammar_mask, mask_rows, logits.shape[1]), _NEG_INF)
    values = torch.nan_to_num(values, nan=_NEG_INF, neginf=_NEG_INF)
    has_candidate = values.amax(dim=-1, keepdim=True) > _NEG_INF
    logprobs = torch.where(has_candidate, torch.log_softmax(values, dim=-1), _NEG_INF)
    valid = tokens >= 0
    chosen = logprobs.gather(1, torch.where(valid, tokens, 0).unsqueeze(-1)).squeeze(-1)
    chosen = torch.where(valid, chosen, _NEG_INF)
    # Stable descending sort: probability descending, id ascending on ties (the canonical order).
    order = torch.sort(logprobs, dim=-1, descending=True, stable=True).indices[:, :num_top]
    top = logprobs.gather(1, order)
    return chosen.to(torch.float32), order, top.to(torch.float32)


@abi_op(_OP, mutates_args=(), schema=_SCHEMA)
def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, penalties: torch.Tensor,
                   prompt_counts: torch.Tensor, output_counts: torch.Tensor, grammar_mask: torch.Tensor,
                   mask_rows: torch.Tensor, num_top: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(chosen, top_ids, top_logprobs); see the module docstring."""
    check_logprob_args(logits, tokens, penalties, prompt_counts, output_counts, grammar_mask, mask_rows, num_top)
    return logprobs_reference(logits, tokens, penalties, prompt_counts, output_counts, grammar_mask, mask_rows,
                              num_top)


@token_logprobs.register_fake
def _token_logprobs_fake(logits, tokens, penalties, prompt_counts, output_counts, grammar_mask, mask_rows,
                         num_top: int):
    num_rows = logits.shape[0]
    return (logits.new_empty((num_rows,)), logits.new_empty((num_rows, num_top), dtype=torch.int64),
            logits.new_empty((num_rows, num_top)))
