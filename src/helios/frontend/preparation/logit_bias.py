"""``logit_bias``: OpenAI's per-token bias, validated here and applied on the device.

The body maps token ids (decimal strings) to a bias in [-100, 100]; at most `MAX_LOGIT_BIAS`
entries (the width of the prepared programs' ``logit_bias_*`` inputs; a core prepared by an older
helios has none and answers 400). Each bias is added to that token's logit before sampling, so
small values nudge the token, -100 all but bans it and 100 all but forces it; the values
``logprobs`` reports are those of the biased distribution. Ids outside the sampled vocabulary
are a 400 naming the id, and so are two keys naming one token (``"05"`` and ``"5"``: the keys are
distinct strings, the ids are not). Speculative programs apply the bias at every drafted and
verified position, so a request with a bias speculates (on a core prepared before they took the
bias inputs it decodes plainly).
"""

from __future__ import annotations

from typing import Mapping

from helios.errors import RequestError

MAX_LOGIT_BIAS = 300


class LogitBiasError(RequestError):
    """A logit-bias id outside the vocabulary or named twice, or more entries than the core takes."""

    param = "logit_bias"


class LogitBiasUnavailable(RequestError):
    """The core's programs take no logit bias (prepared before it existed)."""

    param = "logit_bias"


def parse_logit_bias(value: Mapping[str, float] | None, vocab_size: int, capacity: int) -> tuple[tuple[int, float], ...]:
    """(token id, bias) pairs by id; () for none. `LogitBiasError` / `LogitBiasUnavailable` (400)."""
    if not value:
        return ()
    if not capacity:
        raise LogitBiasUnavailable("this core's programs take no logit_bias (it was prepared by an older helios); "
                                   "prepare it again to serve logit_bias")
    if len(value) > capacity:
        raise LogitBiasError(f"logit_bias holds {len(value)} entries; this core takes at most {capacity}")
    keys: dict[int, str] = {}  # token id -> the key that named it
    entries = []
    for key, bias in value.items():
        token = int(key)
        if not 0 <= token < vocab_size:
            raise LogitBiasError(f"logit_bias token id {key} is outside the vocabulary [0, {vocab_size})")
        first = keys.setdefault(token, key)
        if first != key:
            raise LogitBiasError(f"logit_bias names token {token} twice ({first!r} and {key!r})")
        entries.append((token, float(bias)))
    return tuple(sorted(entries))
