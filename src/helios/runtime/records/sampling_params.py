"""One request's sampling parameters: the single typed record they travel in, end to end.

The frontend resolves a request's `SamplingParams` (explicit values over the model's defaults),
the scheduler keeps it in the request's `RequestSpec`, the packer writes it into a program's
SEED_BITS and SAMPLING_PARAMETERS bindings, and the tensor-parallel wire carries it to the peers.
Nothing else spells the seven parameters out: `packed()` is the one place that orders them the
way ``helios::sample`` reads its FP32 parameter row (`helios.abi.sampling.SAMPLING_PARAMETER_COLUMNS`).

The seed has one representation everywhere: a signed 64-bit integer, the value the sampler's int64
seed tensor holds. A request's ``seed`` field (the OpenAI API's signed 64-bit integer) is used as
given; an unsigned source (a core's fixed seed, fresh random bits) is converted once, where it
enters, with `signed_seed` (its two's-complement bits: the same 64 bits, so the same draws).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from helios.abi.sampling import SAMPLING_PARAMETER_COLUMNS

SEED_BITS = 64
# A top_k this large is at least every vocabulary (a float32 row of 2**30 logits is 4 GiB), so it is
# off, as 0 is; larger values are stored as 0, which float32 and the wire's int64 word hold exactly.
TOP_K_OFF = 2**30
# The smallest positive float32 (a subnormal) and the largest: a positive repetition penalty outside
# them is packed as the nearer one, not rounded to 0 (x / 0 = inf: every seen positive logit ties)
# or to inf (0 * inf = NaN: a seen zero logit is banned), so seen logits are scaled, as in float64.
_F32_TINY, _F32_MAX = float.fromhex("0x1p-149"), float.fromhex("0x1.fffffep127")
SEED_MIN, SEED_MAX = -(2 ** (SEED_BITS - 1)), 2 ** (SEED_BITS - 1) - 1
_SPAN = 2**SEED_BITS


def signed_seed(value: int) -> int:
    """The signed 64-bit seed whose two's-complement bits are `value`'s low 64 bits (any int)."""
    bits = value % _SPAN
    return bits - _SPAN if bits > SEED_MAX else bits


def seed_bits(seed: int) -> int:
    """The unsigned 64 bits of a signed seed (the inverse of `signed_seed` on [0, 2**64))."""
    return seed % _SPAN


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Complete sampling values of one request (immutable; see the module docstring).

    `temperature` not above 0 (0, negative or NaN) is greedy; `top_k` 0 (or at least the
    vocabulary), `top_p` 1 and `min_p` 0 turn their filters off; penalties 1 (repetition) and 0
    (presence, frequency) are neutral. `seed` is a signed 64-bit integer (`SEED_MIN`..`SEED_MAX`).
    A `top_k` of `TOP_K_OFF` or more, or of -`TOP_K_OFF` or less (any size: a client's integer), is
    off and stored as 0.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not SEED_MIN <= self.seed <= SEED_MAX:
            raise ValueError(f"seed {self.seed!r} is not a signed 64-bit integer (convert with signed_seed)")
        if not -TOP_K_OFF < self.top_k < TOP_K_OFF:  # off whatever its size; float() of it may overflow
            object.__setattr__(self, "top_k", 0)

    @property
    def is_greedy(self) -> bool:
        """Whether every token is the argmax (temperature 0, negative or NaN): the seed is unused."""
        return not self.temperature > 0

    @property
    def penalised(self) -> bool:
        """Whether a penalty is not neutral (repetition 1, presence and frequency 0): only then do
        the sampled tokens depend on the prompt and output histograms (`helios.abi.sampling`)."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def packed(self) -> tuple[float, ...]:
        """The FP32 parameter row of ``helios::sample``, in `SAMPLING_PARAMETER_COLUMNS` order (a
        positive repetition penalty stays positive and finite in float32: see `_F32_TINY`)."""
        repetition = float(self.repetition_penalty)
        if repetition > 0.0:
            repetition = min(max(repetition, _F32_TINY), _F32_MAX)
        return (float(self.temperature), float(self.top_k), float(self.top_p), float(self.min_p),
                repetition, float(self.presence_penalty), float(self.frequency_penalty))

    @classmethod
    def from_packed(cls, row, seed: int = 0) -> SamplingParams:
        """The inverse of `packed` (a top-k that is not a whole number is refused)."""
        values = dict(zip(SAMPLING_PARAMETER_COLUMNS, (float(v) for v in row)))
        if len(values) != len(SAMPLING_PARAMETER_COLUMNS):
            raise ValueError(f"{len(tuple(row))} packed sampling parameters; expected {len(SAMPLING_PARAMETER_COLUMNS)}")
        top_k = values["top_k"]
        if not math.isfinite(top_k) or top_k != int(top_k):
            raise ValueError(f"top_k {top_k!r} is not a whole number")
        return cls(values["temperature"], values["top_p"], int(top_k), values["min_p"], values["repetition"],
                   values["presence"], values["frequency"], seed)

    def with_seed(self, seed: int) -> SamplingParams:
        """The same parameters with `seed` (any int, wrapped to its signed 64-bit value)."""
        return SamplingParams(self.temperature, self.top_p, self.top_k, self.min_p, self.repetition_penalty,
                              self.presence_penalty, self.frequency_penalty, signed_seed(seed))


GREEDY = SamplingParams()
