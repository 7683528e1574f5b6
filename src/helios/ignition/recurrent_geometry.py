"""Recurrent (state-space mixer) layers of a hybrid decoder: their geometry and weight slots.

A hybrid Architecture (`Architecture.recurrent`) replaces the attention block of the listed layers
with a Mamba2-style mixer; every layer keeps its pre-norm, post-norm and gated MLP. The mixer's
state lives outside pages, in state rows (a RECURRENT history region): per layer a convolution
window [conv_dim, conv_kernel - 1] in the model dtype and an SSM state [heads, head_dim, state_size]
in float32.

Weight slots of a mixer layer i (after ``layers.i.input_norm``): ``layers.i.mixer.in_proj.weight``
[intermediate + conv_dim + heads, H] (rows: gate z, then x/B/C, then dt), optional
``layers.i.mixer.in_proj.bias``, ``layers.i.mixer.conv.weight`` [conv_dim, conv_kernel],
``layers.i.mixer.conv.bias`` [conv_dim] (zeros when the checkpoint has none),
``layers.i.mixer.dt_bias`` [heads], ``layers.i.mixer.A`` float32 [heads] (negative decay rates,
-exp(A_log)), ``layers.i.mixer.D`` [heads], ``layers.i.mixer.norm`` [intermediate] (gated group
RMS norm), ``layers.i.mixer.out.weight`` [H, intermediate], optional ``layers.i.mixer.out.bias``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class RecurrentGeometry:
    """Which layers are mixers and their extents. `dt_limit` clamps the discretised step sizes."""

    layers: tuple[int, ...]
    num_heads: int
    head_dim: int
    state_size: int
    num_groups: int
    conv_kernel: int
    proj_bias: bool = False
    out_bias: bool = False
    dt_limit: tuple[float, float] = (0.0, math.inf)
    # Tensor-parallel ranks one gated-norm group spans (1: the groups are this rank's own). A
    # one-group mixer split over N ranks keeps B/C whole on every rank and sums the norm's squares
    # over the N ranks (`helios.ignition.hybrid_decoder.gated_group_norm`).
    norm_ranks: int = 1

    @property
    def intermediate(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.intermediate + 2 * self.num_groups * self.state_size

    @property
    def projection(self) -> int:
        return self.intermediate + self.conv_dim + self.num_heads

    def problems(self, num_layers: int) -> list[str]:
        """Invariant violations (empty when the geometry is consistent)."""
        found = []
        if not self.layers or len(set(self.layers)) != len(self.layers):
            found.append("recurrent layers must be distinct and at least one")
        if any(not 0 <= layer < num_layers for layer in self.layers):
            found.append(f"recurrent layers {self.layers} lie outside 0..{num_layers - 1}")
        if self.num_groups < 1 or self.num_heads % self.num_groups:
            found.append(f"{self.num_heads} mixer heads are not a multiple of {self.num_groups} groups")
        if self.conv_kernel < 2:
            found.append("the mixer convolution needs at least 2 taps")
        return found


def mixer_slots(arch, prefix: str, slot) -> list:
    """Weight slots of one mixer (see the module docstring); `slot(name, *shape)` makes one."""
    g: RecurrentGeometry = arch.recurrent
    p = prefix + "mixer."
    slots = [slot(p + "in_proj.weight", g.projection, arch.hidden_size)]
    if g.proj_bias:
        slots.append(slot(p + "in_proj.bias", g.projection))
    slots += [slot(p + "conv.weight", g.conv_dim, g.conv_kernel), slot(p + "conv.bias", g.conv_dim),
              slot(p + "dt_bias", g.num_heads), slot(p + "A", g.num_heads, dtype="float32"),
              slot(p + "D", g.num_heads), slot(p + "norm", g.intermediate),
              slot(p + "out.weight", arch.hidden_size, g.intermediate)]
    if g.out_bias:
        slots.append(slot(p + "out.bias", arch.hidden_size))
    return slots
