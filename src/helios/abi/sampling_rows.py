"""Greedy tokens of slot-indexed rows: the GREEDY variant of ``helios::sample`` without its gathers.

A program samples each row with the row's prompt and output counts, which it gathers from per-slot
tables (``prompt_counts[request_slots.clamp(min=0)]``, the same for ``output_counts``): two
[R, V] int32 copies per step, made whatever the penalties are, although the greedy pass reads
counts only in penalised rows. `greedy_rows` takes the tables and the rows' slots instead and reads
a row's counts at its slot, only where the row is penalised; a row whose slot is negative (a
padding row past the live ones, which samples nothing) reads nothing at all and gets NO_TOKEN.

Exactness: for every row with a slot >= 0 the token is `SampleVariant.GREEDY`'s for the gathered
arguments (`helios.abi.sampling`'s reference greedy token, bit for bit): the same kernel
(`helios.abi.triton_sampling.greedy_tokens`) reads the same count values through the slot instead
of through a gathered copy. On the CPU the counts are gathered and the host path runs (tests).

`greedy_rows_biased` takes the head's product itself (bfloat16 or float16 [R, V], whose float32
widening the program samples) and the rows' logit bias (ids [R, B], -1 padding; values [R, B]),
and gives the token `greedy_rows` gives for ``product.float()`` with the bias scatter-added: the
kernel widens the values as it reads them and adds each row's bias in its combine, so neither the
[R, V] float32 copy nor its biased copy is made (`greedy_tokens`'s ``bias``).

A runtime binds them into a captured greedy graph in place of the sampling call
(`helios.runtime.loading.sampling_rewrite`); they are no ops of the ABI and no core calls them.
"""

from __future__ import annotations

import torch

from helios.abi.grammar import check_mask_args
from helios.abi.registry import AbiArgumentError, check_same_device, check_tensor
from helios.abi.sampling import NO_TOKEN, NUM_PENALTIES, DrawParams, host_sample

_NAME = "greedy_rows"
_PRODUCT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_rows_args(logits: torch.Tensor, penalties: torch.Tensor, prompt_table: torch.Tensor,
                    output_table: torch.Tensor, slots: torch.Tensor, grammar_mask: torch.Tensor,
                    mask_rows: torch.Tensor, dtypes: tuple = (torch.float32,)) -> None:
    """Raise `AbiArgumentError` unless the arguments are those of ``helios::sample`` (logits
    [R, V] of one of `dtypes`, penalties [R, 3], the grammar mask and mask rows) with the counts as
    int32 tables [S, V] and the slots an integer [R], all on one device. Reads metadata only."""
    num_rows, vocab_size = check_mask_args(_NAME, logits, grammar_mask, mask_rows)
    if logits.dtype not in dtypes:
        names = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise AbiArgumentError(f"{_NAME}: logits must be {names} [R, V], got {logits.dtype}")
    check_tensor(_NAME, "penalties", penalties, torch.float32, (num_rows, NUM_PENALTIES))
    for name, table in (("prompt_table", prompt_table), ("output_table", output_table)):
        check_tensor(_NAME, name, table, torch.int32, (None, vocab_size))
    if not isinstance(slots, torch.Tensor) or slots.dtype not in (torch.int32, torch.int64) \
            or tuple(slots.shape) != (num_rows,):
        raise AbiArgumentError(f"{_NAME}: slots must be an int32 or int64 Tensor [{num_rows}]")
    check_same_device(_NAME, {"logits": logits, "penalties": penalties, "prompt_table": prompt_table,
                              "output_table": output_table, "slots": slots})


def greedy_rows(logits: torch.Tensor, penalties: torch.Tensor, prompt_table: torch.Tensor,
                output_table: torch.Tensor, slots: torch.Tensor, grammar_mask: torch.Tensor,
                mask_rows: torch.Tensor) -> torch.Tensor:
    """int64 [R]: row r's greedy token with the counts at row ``slots[r]`` of the tables, or
    NO_TOKEN where ``slots[r] < 0`` (see the module docstring). On CUDA nothing is allocated but
    the kernel's output and partials, and nothing is read on the host (a CUDA graph holds it)."""
    check_rows_args(logits, penalties, prompt_table, output_table, slots, grammar_mask, mask_rows)
    if logits.device.type == "cuda":
        from helios.abi.triton_sampling import greedy_tokens

        return greedy_tokens(logits, penalties, prompt_table, output_table, grammar_mask, mask_rows,
                             row_slots=slots)
    counts = (prompt_table[slots.clamp(min=0)], output_table[slots.clamp(min=0)])
    none = torch.zeros(logits.shape[0], dtype=torch.int64)
    greedy = torch.zeros(logits.shape[0], dtype=torch.float32)
    params = DrawParams(none, none, greedy, none.to(torch.int32), greedy + 1, greedy)
    tokens = host_sample(logits, params, penalties, counts, grammar_mask, mask_rows, draws=False)
    return torch.where(slots >= 0, tokens, NO_TOKEN)


def greedy_rows_biased(product: torch.Tensor, bias_ids: torch.Tensor, bias_values: torch.Tensor,
                       penalties: torch.Tensor, prompt_table: torch.Tensor, output_table: torch.Tensor,
                       slots: torch.Tensor, grammar_mask: torch.Tensor, mask_rows: torch.Tensor) -> torch.Tensor:
    """`greedy_rows` of ``product.float()`` plus each row's bias at its ids (ids >= 0, distinct in a
    row; -1 pads), as ``scatter_add`` adds it, without either [R, V] float32 copy (module
    docstring). `product` may be bfloat16, float16 or float32; on CUDA it is left as it was."""
    check_rows_args(product, penalties, prompt_table, output_table, slots, grammar_mask, mask_rows,
                    dtypes=_PRODUCT_DTYPES)
    num_rows = product.shape[0]
    if not isinstance(bias_ids, torch.Tensor) or bias_ids.dtype not in (torch.int32, torch.int64) \
            or bias_ids.dim() != 2 or bias_ids.shape[0] != num_rows:
        raise AbiArgumentError(f"{_NAME}: bias_ids must be an int32 or int64 Tensor [{num_rows}, B]")
    check_tensor(_NAME, "bias_values", bias_values, torch.float32, tuple(bias_ids.shape))
    check_same_device(_NAME, {"product": product, "bias_ids": bias_ids, "bias_values": bias_values})
    if product.device.type == "cuda":
        from helios.abi.triton_sampling import greedy_tokens

        return greedy_tokens(product, penalties, prompt_table, output_table, grammar_mask, mask_rows,
                             row_slots=slots, bias=(bias_ids, bias_values))
    real = bias_ids >= 0
    logits = product.to(torch.float32).scatter_add(1, bias_ids.clamp(min=0).to(torch.int64),
                                                   torch.where(real, bias_values, torch.zeros_like(bias_values)))
    return greedy_rows(logits, penalties, prompt_table, output_table, slots, grammar_mask, mask_rows)
