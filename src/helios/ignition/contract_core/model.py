"""The small model a contract-driven core serves (`helios.ignition.contract_core`), and its plain
reference computation.

Every program of such a core computes the same function, whatever its operation:

    logits(t) = embed[t] @ lm_head^T          (t outside the sampled vocabulary: zero logits)

so the next token depends on the last one only, and every graph (prefill, mixed, decode, speculative)
agrees on it; sampling goes through ``helios::sample`` with the request's parameters, seeds and the
per-state-row output histogram. Speculative programs draft with a second, cheaper model over
``w.draft.token_codes`` (draft logits(t) = codes[t] . codes^T), or copy the runtime's history
candidates, and verify the drafts against the target. A VISION program turns pixel patches into
features through the embedding; prompt programs put a feature in place of its placeholder token's
embedding. A graph that binds host-table rows (Engram) adds the rows it is staged, per state row,
into the ``draft_hidden``-style state view it writes (`ENGRAM_SINK`), where a test can read them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

EMBED, HEAD, DRAFT_CODES = "w.embed", "w.lm_head", "w.draft.token_codes"


@dataclass(frozen=True)
class ReferenceModel:
    """The weights the programs compute with (float32 copies)."""

    embed: torch.Tensor  # [V, H]
    head: torch.Tensor  # [V, H]

    def logits(self, token: int) -> torch.Tensor:
        if token >= self.embed.shape[0]:
            return torch.zeros(self.head.shape[0])
        return self.embed[token] @ self.head.T

    def greedy(self, prompt: list[int], max_tokens: int, eos_ids: frozenset[int] = frozenset(),
               bias: dict[int, float] | None = None) -> list[int]:
        """The greedy continuation of `prompt` (stopping after an EOS id), `bias` added to the logits."""
        out, token = [], prompt[-1]
        shift = torch.zeros(self.head.shape[0])
        for index, value in (bias or {}).items():
            shift[index] = value
        for _ in range(max_tokens):
            token = int(torch.argmax(self.logits(token) + shift))
            out.append(token)
            if token in eos_ids:
                break
        return out

    def prompt_logprobs(self, prompt: list[int]) -> list[float]:
        """log p(prompt[i + 1] | prompt[..i]) for every i."""
        return [float(torch.log_softmax(self.logits(a), -1)[b]) for a, b in zip(prompt, prompt[1:])]
