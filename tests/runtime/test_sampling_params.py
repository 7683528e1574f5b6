"""`SamplingParams`: one typed record for a request's sampling values, one signed seed."""

from __future__ import annotations

import math

import pytest

from helios.abi.sampling import NEUTRAL_SAMPLING_PARAMETERS, SAMPLING_PARAMETER_COLUMNS
from helios.runtime.records.sampling_params import GREEDY, SEED_MAX, SEED_MIN, SamplingParams, seed_bits, signed_seed


@pytest.mark.parametrize("temperature, greedy", [(0.0, True), (-1.0, True), (math.nan, True), (1e-6, False),
                                                 (0.7, False)])
def test_is_greedy_unless_the_temperature_is_above_zero(temperature, greedy):
    assert SamplingParams(temperature=temperature).is_greedy is greedy
    assert GREEDY.is_greedy and GREEDY.packed() == NEUTRAL_SAMPLING_PARAMETERS


@pytest.mark.parametrize("bits", [0, 1, 2**63 - 1, 2**63, 2**64 - 1, 2**40 + 7])
def test_seed_bits_and_the_signed_seed_round_trip(bits):
    seed = signed_seed(bits)
    assert SEED_MIN <= seed <= SEED_MAX and seed_bits(seed) == bits
    assert signed_seed(seed) == seed  # a signed seed is already what the sampler uses


def test_the_signed_seed_is_the_twos_complement_of_the_bits():
    assert signed_seed(2**64 - 1) == -1 and signed_seed(2**63) == SEED_MIN and signed_seed(2**70 + 5) == 5
    assert SamplingParams(seed=5).with_seed(SEED_MAX + 1).seed == SEED_MIN  # fan-out wraps, never overflows


def test_packed_follows_the_sampler_columns_and_round_trips():
    params = SamplingParams(0.8, 0.95, 40, 0.05, 1.3, 0.2, 0.1, seed=-12)
    row = dict(zip(SAMPLING_PARAMETER_COLUMNS, params.packed()))
    assert row == {"temperature": 0.8, "top_k": 40.0, "top_p": 0.95, "min_p": 0.05, "repetition": 1.3,
                   "presence": 0.2, "frequency": 0.1}
    assert SamplingParams.from_packed(params.packed(), seed=-12) == params


@pytest.mark.parametrize("seed", [2**63, SEED_MIN - 1, 1.5, True])
def test_a_seed_outside_the_signed_range_is_refused(seed):
    with pytest.raises(ValueError, match="signed 64-bit"):
        SamplingParams(seed=seed)


def test_a_packed_row_of_the_wrong_length_or_a_fractional_top_k_is_refused():
    with pytest.raises(ValueError, match="expected 7"):
        SamplingParams.from_packed((0.0,) * 6)
    with pytest.raises(ValueError, match="whole number"):
        SamplingParams.from_packed((0.0, 2.5, 1.0, 0.0, 1.0, 0.0, 0.0))
