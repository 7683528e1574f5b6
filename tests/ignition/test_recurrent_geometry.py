"""`helios.ignition.recurrent_geometry`: every recurrent geometry names a bad layer list (repeated,
empty, outside the model) and its own bad extents."""

from __future__ import annotations

import dataclasses

import pytest

from helios.ignition.recurrent_geometry import (
    GatedDeltaNetGeometry, KimiDeltaGeometry, RecurrentGeometry, ShortConvGeometry,
)

GEOMETRIES = {
    "mamba2": (RecurrentGeometry((0, 2), num_heads=4, head_dim=8, state_size=16, num_groups=2, conv_kernel=4),
               "recurrent", dict(num_groups=3), "not a multiple of 3 groups"),
    "gated-deltanet": (GatedDeltaNetGeometry((1,), num_key_heads=2, num_value_heads=4, key_head_dim=8,
                                             value_head_dim=8, conv_kernel=4),
                       "linear-attention", dict(beta_scale=0.0), "beta_scale 0.0"),
    "short-conv": (ShortConvGeometry((0, 1), channels=16, conv_kernel=3), "short convolution", dict(channels=0),
                   "at least one channel"),
    "kimi-delta": (KimiDeltaGeometry((0,), num_heads=2, head_dim=8, conv_kernel=4), "linear-attention",
                   dict(lower_bound=0.5), "lower_bound 0.5"),
}


@pytest.mark.parametrize("name", sorted(GEOMETRIES))
def test_each_geometry_names_its_problems(name):
    geometry, kind, bad_extent, message = GEOMETRIES[name]
    assert geometry.problems(num_layers=3) == []
    assert geometry.problems(num_layers=1 if max(geometry.layers) else 0) == \
        [f"{kind} layers {geometry.layers} lie outside 0..{0 if max(geometry.layers) else -1}"]
    repeated = dataclasses.replace(geometry, layers=geometry.layers + geometry.layers[:1])
    assert repeated.problems(num_layers=3) == [f"{kind} layers must be distinct and at least one"]
    assert dataclasses.replace(geometry, layers=()).problems(num_layers=3) == \
        [f"{kind} layers must be distinct and at least one"]
    assert any(message in problem for problem in dataclasses.replace(geometry, **bad_extent).problems(num_layers=3))
