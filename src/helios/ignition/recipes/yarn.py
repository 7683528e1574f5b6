"""YaRN rotary scaling ("rope_type": "yarn"), with the reference's arithmetic (transformers'
`_compute_yarn_parameters`): blended inverse frequencies plus an attention factor that multiplies the
rotary cos/sin tables (`Architecture.rope_attention_factor`)."""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from helios.ignition.recipes.base import UnsupportedCheckpoint


def yarn_inv_freq(params: Mapping[str, Any], head_dim: int,
                  max_position_embeddings: int | None = None) -> tuple[torch.Tensor, float]:
    """(float32 inverse frequencies [head_dim / 2], attention factor) of a YaRN rope config."""
    base, dim = float(params["rope_theta"]), head_dim
    original = params["original_max_position_embeddings"]
    factor = _factor(params, max_position_embeddings)
    attention_factor = yarn_attention_factor(params, max_position_embeddings)
    beta_fast, beta_slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1
    low, high = _correction_range(beta_fast, beta_slow, dim, base, original, params.get("truncate", True))
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    extrapolation_factor = 1 - _linear_ramp(low, high, dim // 2)
    inv_freq = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor
    return nonzero_frequencies(inv_freq, attention_factor, base), float(attention_factor)


def nonzero_frequencies(inv_freq: torch.Tensor, attention_factor: float, theta: float) -> torch.Tensor:
    """`inv_freq`, unless a frequency underflowed to 0 in float32 (a theta past ~1e38) while an
    attention factor scales the rotated pairs: the programs take a zero frequency for a pass-through
    pair of a partially rotated head and leave it unscaled, where the reference scales it."""
    if attention_factor != 1.0 and not bool(inv_freq.all()):
        raise UnsupportedCheckpoint(f"rope_theta {theta:g} underflows rotary frequencies to 0 in float32 under "
                                    f"YaRN's attention factor {attention_factor:g}")
    return inv_freq


def yarn_attention_factor(params: Mapping[str, Any], max_position_embeddings: int | None = None) -> float:
    """The factor on the rotary cos/sin tables of a YaRN rope config."""
    factor = _factor(params, max_position_embeddings)
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = float(_mscale(factor, mscale) / _mscale(factor, mscale_all_dim))
        else:
            attention_factor = _mscale(factor)
    return float(attention_factor)


def _factor(params: Mapping[str, Any], max_position_embeddings: int | None) -> float:
    factor = params.get("factor")
    return max_position_embeddings / params["original_max_position_embeddings"] if factor is None else factor


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _correction_dim(num_rotations: float, dim: int, base: float, max_positions: int) -> float:
    return (dim * math.log(max_positions / (num_rotations * 2 * math.pi))) / (2 * math.log(base))


def _correction_range(low_rot, high_rot, dim: int, base: float, max_positions: int, truncate: bool):
    low = _correction_dim(low_rot, dim, base, max_positions)
    high = _correction_dim(high_rot, dim, base, max_positions)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def _linear_ramp(low: float, high: float, dim: int) -> torch.Tensor:
    if low == high:
        high += 0.001  # the reference's guard against a zero-width ramp
    return torch.clamp((torch.arange(dim, dtype=torch.float32) - low) / (high - low), 0, 1)
