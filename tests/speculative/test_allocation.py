"""Device prefix allocation (``helios::allocate_prefixes``): the spec's rule, case by case and
against a step-by-step frontier reference on random cohorts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import helios.abi.speculative  # noqa: F401  (registers the op)
from helios.abi.registry import AbiArgumentError


def allocate(confidence, ceilings, capacity: int) -> list[int]:
    lengths = torch.ops.helios.allocate_prefixes(
        torch.tensor(confidence, dtype=torch.float32), torch.tensor(ceilings, dtype=torch.int32), capacity)
    assert lengths.dtype == torch.int32
    return lengths.tolist()


def frontier_reference(confidence, ceilings, capacity: int) -> list[int]:
    """The rule literally: every active lane starts with its pending position; then the lane whose
    next proposal has the highest survival (FP64 product of FP32 values) gains it; ties go to the
    shorter prefix, then the lower row."""
    conf = [[float(np.float32(c)) for c in row] for row in confidence]
    lengths = [1 if c > 0 else 0 for c in ceilings]
    budget = capacity - sum(lengths)
    while budget > 0:
        best = None
        for row, (length, ceiling) in enumerate(zip(lengths, ceilings)):
            if length == 0 or length >= ceiling:
                continue
            survival = 1.0
            for value in conf[row][:length]:
                survival *= value
            key = (-survival, length, row)
            best = key if best is None or key < best else best
        if best is None:
            break
        lengths[best[2]] += 1
        budget -= 1
    return lengths


def test_every_lane_starts_with_its_pending_position():
    assert allocate([[0.0, 0.0], [0.0, 0.0], [0.9, 0.9]], [3, 1, 0], 2) == [1, 1, 0]


def test_highest_survival_wins_and_products_accumulate():
    # lane 0 survives 0.9 then 0.9 * 0.5 = 0.45; lane 1 survives 0.6 then 0.6 * 0.99 = 0.594
    confidence = [[0.9, 0.5, 0.9], [0.6, 0.99, 0.1]]
    assert allocate(confidence, [4, 4], 2 + 1) == [2, 1]  # 0.9 first
    assert allocate(confidence, [4, 4], 2 + 2) == [2, 2]  # then 0.6
    assert allocate(confidence, [4, 4], 2 + 3) == [2, 3]  # then 0.594 beats 0.45
    assert allocate(confidence, [4, 4], 2 + 4) == [3, 3]


def test_ties_prefer_shorter_prefixes_then_lower_rows():
    # row 0's second proposal and row 1's first both survive with probability 0.5 exactly
    confidence = [[1.0, 0.5], [0.5, 1.0], [0.5, 0.25]]
    assert allocate(confidence, [3, 3, 3], 3 + 1) == [2, 1, 1]  # 1.0 first
    assert allocate(confidence, [3, 3, 3], 3 + 2) == [2, 2, 1]  # 0.5 ties: prefix 1 before prefix 2
    assert allocate(confidence, [3, 3, 3], 3 + 3) == [2, 2, 2]  # then the lower row among prefix-1 ties
    assert allocate(confidence, [3, 3, 3], 3 + 4) == [3, 2, 2]  # prefix 2 ties: row 0 before row 1


def test_later_confidence_cannot_admit_a_predecessor():
    # lane 0's second proposal is certain, but its first is unlikely: it cannot jump the queue
    confidence = [[0.1, 1.0], [0.5, 0.4]]
    assert allocate(confidence, [3, 3], 2 + 2) == [1, 3]
    assert allocate(confidence, [3, 3], 2 + 3) == [2, 3]


def test_products_are_taken_in_fp64_of_fp32_values():
    # Lane 0's second prefix survives a * b (exact in FP64), lane 1's survives c = fl32(a * b), which
    # rounded up: FP32 products would tie them (and the lower row, lane 0, would win); in FP64 c is
    # larger, so lane 1 wins.
    rng = np.random.default_rng(7)
    while True:
        a, b = np.float32(rng.uniform(0.5, 1)), np.float32(rng.uniform(0.5, 1))
        c = a * b  # numpy float32 product: rounded to FP32
        if float(a) * float(b) < float(c):
            break
    confidence = [[float(a), float(b)], [1.0, float(c)]]
    assert allocate(confidence, [3, 3], 2 + 2) == [2, 2]  # both first proposals (a and 1.0)
    assert allocate(confidence, [3, 3], 2 + 3) == [2, 3]  # then c > a * b in FP64
    assert frontier_reference(confidence, [3, 3], 5) == [2, 3]


def test_ceilings_summing_above_the_packed_capacity():
    confidence = [[0.9, 0.9, 0.9]] * 4
    lengths = allocate(confidence, [4, 4, 4, 4], 10)
    assert sum(lengths) == 10 and all(1 <= n <= 4 for n in lengths)
    assert lengths == [3, 3, 2, 2]  # equal survivals: shorter prefixes first, then lower rows


def test_ceilings_cap_each_lane():
    assert allocate([[1.0, 1.0, 1.0], [0.1, 0.1, 0.1]], [2, 4], 8) == [2, 4]


@pytest.mark.parametrize("confidence, ceilings, capacity", [
    ([[float("nan"), 0.5]], [3], 4),
    ([[1.5, 0.5]], [3], 4),
    ([[-0.1, 0.5]], [3], 4),
    ([[0.5, 0.5]], [4], 4),  # ceiling above D + 1
    ([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]], [3, 3, 3], 3),  # four active lanes cannot fit P = 3
])
def test_invalid_cohorts_are_rejected_whole(confidence, ceilings, capacity):
    # a valid extra lane shares the cohort: it is rejected with the rest
    lengths = allocate(confidence + [[0.9, 0.9]], ceilings + [2], capacity)
    assert lengths == [0] * (len(confidence) + 1)


def test_argument_checks():
    with pytest.raises(AbiArgumentError):
        torch.ops.helios.allocate_prefixes(torch.zeros(2, 2, dtype=torch.float64), torch.zeros(2, dtype=torch.int32), 2)
    with pytest.raises(AbiArgumentError):
        torch.ops.helios.allocate_prefixes(torch.zeros(2, 2), torch.zeros(3, dtype=torch.int32), 2)
    with pytest.raises(AbiArgumentError):
        torch.ops.helios.allocate_prefixes(torch.zeros(2, 2), torch.zeros(2, dtype=torch.int32), 0)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_matches_the_frontier_rule_on_random_cohorts(data):
    rows = data.draw(st.integers(1, 6))
    drafts = data.draw(st.integers(1, 5))
    levels = st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]) | st.floats(0, 1, width=32)
    confidence = [[data.draw(levels) for _ in range(drafts)] for _ in range(rows)]
    ceilings = [data.draw(st.integers(0, drafts + 1)) for _ in range(rows)]
    active = sum(c > 0 for c in ceilings)
    capacity = data.draw(st.integers(max(1, active), max(1, active) + rows * drafts))
    lengths = allocate(confidence, ceilings, capacity)
    assert lengths == frontier_reference(confidence, ceilings, capacity)
    assert sum(lengths) <= capacity
