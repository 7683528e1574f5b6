"""Grammar (structured output) token masks: ``helios::apply_grammar_mask`` and its bit layout.

Layout (shared with llguidance and xgrammar): a row's mask is int32 [ceil(V / 32)]; bit j of word w
(``(word >> j) & 1``, bit 31 being the sign bit) allows token 32 * w + j. Bits for ids >= V in the
last word are ignored. A mask applies only to rows whose ``mask_rows`` entry is true; other rows are
returned bit-identical (NaN included), whatever their mask words hold.

``helios::apply_grammar_mask(logits, grammar_mask, mask_rows)`` returns a new tensor: logits of
disallowed tokens in masked rows become -inf. A masked row that allows no token comes back entirely
-inf; this is the defined outcome, and ``helios::sample`` returns ``NO_TOKEN`` (-1) for such a row
instead of inventing a token (the host's completion validation reports it for that lane).
The op accepts float32, float16 and bfloat16 logits and keeps their dtype; the result is
contiguous. It never mutates its inputs. The body is elementwise tensor code on every device (no
host read, no host tensor), so it can be captured into a CUDA graph.
"""

from __future__ import annotations

import torch

from helios.abi.op_library import abi_op
from helios.abi.registry import AbiArgumentError, check_same_device, check_tensor

MASK_WORD_BITS = 32
LOGIT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
APPLY_GRAMMAR_MASK_SCHEMA = "(Tensor logits, Tensor grammar_mask, Tensor mask_rows) -> Tensor"


def mask_words(vocab_size: int) -> int:
    """Number of int32 words in one row's mask: ceil(V / 32)."""
    return -(-vocab_size // MASK_WORD_BITS)


def unpack_mask(grammar_mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool [R, V]: True where the row's mask allows the token (ignores `mask_rows`)."""
    shifts = torch.arange(MASK_WORD_BITS, dtype=torch.int32, device=grammar_mask.device)
    bits = (grammar_mask.unsqueeze(-1) >> shifts) & 1
    num_rows, num_words = grammar_mask.shape
    return bits.reshape(num_rows, num_words * MASK_WORD_BITS)[:, :vocab_size].bool()


def disallowed(grammar_mask: torch.Tensor, mask_rows: torch.Tensor, vocab_size: int
               ) -> torch.Tensor:
    """bool [R, V]: True for tokens to suppress (masked rows only)."""
    return mask_rows.unsqueeze(-1) & ~unpack_mask(grammar_mask, vocab_size)


def masked_logits(logits: torch.Tensor, grammar_mask: torch.Tensor, mask_rows: torch.Tensor
                  ) -> torch.Tensor:
    """``helios::apply_grammar_mask`` on validated inputs: elementwise on the device, no host read."""
    suppressed = disallowed(grammar_mask, mask_rows, logits.shape[1])
    return logits.masked_fill(suppressed, float("-inf")).contiguous()


def check_mask_args(op: str, logits: torch.Tensor, grammar_mask: torch.Tensor,
                    mask_rows: torch.Tensor) -> tuple[int, int]:
    """Validate the mask inputs against logits [R, V]; return (R, V)."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise AbiArgumentError(f"{op}: logits must be a 2-D Tensor [R, V]")
    num_rows, vocab_size = logits.shape
    if vocab_size < 1:
        raise AbiArgumentError(f"{op}: logits must have at least one vocabulary column")
    check_tensor(op, "grammar_mask", grammar_mask, torch.int32,
                 (num_rows, mask_words(vocab_size)))
    check_tensor(op, "mask_rows", mask_rows, torch.bool, (num_rows,))
    check_same_device(op, {"logits": logits, "grammar_mask": grammar_mask,
                           "mask_rows": mask_rows})
    return num_rows, vocab_size


def _check_apply_args(logits: torch.Tensor, grammar_mask: torch.Tensor,
                      mask_rows: torch.Tensor) -> None:
    op = "helios::apply_grammar_mask"
    check_mask_args(op, logits, grammar_mask, mask_rows)
    if logits.dtype not in LOGIT_DTYPES:
        raise AbiArgumentError(f"{op}: logits must be float32, float16 or bfloat16, "
                               f"got {logits.dtype}")


@abi_op("helios::apply_grammar_mask", mutates_args=(),
                         schema=APPLY_GRAMMAR_MASK_SCHEMA)
def apply_grammar_mask(logits: torch.Tensor, grammar_mask: torch.Tensor,
                       mask_rows: torch.Tensor) -> torch.Tensor:
    """Copy of `logits` with disallowed tokens of masked rows set to -inf."""
    _check_apply_args(logits, grammar_mask, mask_rows)
    return masked_logits(logits, grammar_mask, mask_rows)


@apply_grammar_mask.register_fake
def _apply_grammar_mask_fake(logits: torch.Tensor, grammar_mask: torch.Tensor,
                             mask_rows: torch.Tensor) -> torch.Tensor:
    _check_apply_args(logits, grammar_mask, mask_rows)
    return logits.new_empty(logits.shape)
