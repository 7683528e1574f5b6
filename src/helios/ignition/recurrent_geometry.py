"""Recurrent layers of a hybrid decoder: their geometry and weight slots, of two kinds.

A hybrid Architecture (`Architecture.recurrent`) replaces the attention block of the listed layers
with a recurrent mixer; every layer keeps its pre-norm, post-norm and MLP (gated, or the mixture of
experts where the layer is sparse). The mixer's state lives outside pages, in state rows (a
RECURRENT history region, the programs' ``conv_state`` and ``ssm_state`` inputs): per layer a
convolution window [conv_dim, conv_kernel - 1] in the model dtype and a float32 recurrent state of
`state_shape`. The kind is the geometry's type:

- `RecurrentGeometry`: a Mamba2 mixer (Bamba); state [heads, head_dim, state_size].
- `GatedDeltaNetGeometry`: a Gated DeltaNet linear-attention layer (Qwen3-Next); state
  [value heads, key_head_dim, value_head_dim] (`helios::gated_delta_rule`).
- `KimiDeltaGeometry`: a Kimi Delta Attention layer (Kimi Linear): the gated delta rule with a
  decay per key channel; state [heads, head_dim, head_dim].
- `ShortConvGeometry`: a gated short convolution (LFM2); its whole state is the convolution window,
  and its ``ssm_state`` row is a one-element placeholder no op reads or writes.

Weight slots of a mixer layer i (after ``layers.i.input_norm``): ``layers.i.mixer.in_proj.weight``
[intermediate + conv_dim + heads, H] (rows: gate z, then x/B/C, then dt), optional
``layers.i.mixer.in_proj.bias``, ``layers.i.mixer.conv.weight`` [conv_dim, conv_kernel],
``layers.i.mixer.conv.bias`` [conv_dim] (zeros when the checkpoint has none),
``layers.i.mixer.dt_bias`` [heads], ``layers.i.mixer.A`` float32 [heads] (negative decay rates,
-exp(A_log)), ``layers.i.mixer.D`` [heads], ``layers.i.mixer.norm`` [intermediate] (gated group
RMS norm; absent without ``gated_norm``: the output is then y silu(z), not normed),
``layers.i.mixer.out.weight`` [H, intermediate], optional ``layers.i.mixer.out.bias``.

Weight slots of a Gated DeltaNet layer i (Hk key heads of Dk, Hv value heads of Dv, Hv a multiple of
Hk; key_dim = Hk Dk, value_dim = Hv Dv): ``layers.i.delta.in_proj.weight`` [2 key_dim + 2 value_dim
+ 2 Hv, H] (rows: q, k, v - the convolved channels, in the convolution's order - then the output
gate z, then b, then a; value head h belongs to key head h // (Hv / Hk)), ``layers.i.delta.conv.weight``
[2 key_dim + value_dim, conv_kernel], ``layers.i.delta.conv.bias`` (zeros: the reference's
convolution has none), ``layers.i.delta.dt_bias`` [Hv], ``layers.i.delta.A`` float32 [Hv]
(-exp(A_log)), ``layers.i.delta.norm`` [Dv] (the gated RMS norm of each value head's output, before
its SiLU gate z) and ``layers.i.delta.out.weight`` [H, value_dim]. Per token: q, k, v =
silu(conv(in_proj rows)); beta = sigmoid(b) (times ``beta_scale``); g = A softplus(a + dt_bias); o = the gated delta rule;
out(norm(o) silu(z)) (`helios.ignition.delta_mixer`).

Weight slots of a Kimi Delta Attention layer i (H heads of D; qkv_dim = H D):
``layers.i.kda.in_proj.weight`` [3 qkv_dim + H, hidden] (rows: q, k, v - the convolved channels - then
b), ``layers.i.kda.conv.weight`` [3 qkv_dim, conv_kernel], ``layers.i.kda.conv.bias`` (zeros),
``layers.i.kda.f_a.weight`` [D, hidden] and ``layers.i.kda.f_b.weight`` [qkv_dim, D] (the forget
gate's low-rank projection), ``layers.i.kda.dt_bias`` float32 [qkv_dim], ``layers.i.kda.A`` float32 [H]
(-exp(A_log)), ``layers.i.kda.g_a.weight`` [D, hidden] and ``layers.i.kda.g_b.weight`` [qkv_dim, D]
(the output gate's; with ``low_rank_gates`` off, Bailing's full-rank ``layers.i.kda.f.weight`` and
``layers.i.kda.g.weight`` [qkv_dim, hidden] instead of each pair), ``layers.i.kda.norm`` [D] and
``layers.i.kda.out.weight`` [hidden, qkv_dim]. Per
token: q, k, v = silu(conv(in_proj rows)); beta = sigmoid(b); g = A softplus(f_b f_a x + dt_bias) per
channel (with ``lower_bound`` < 0: lower_bound sigmoid(-A (f x + dt_bias))); o = the gated delta rule
with that per-channel decay; out(norm(o) sigmoid(g_b g_a x))
(`helios.ignition.kimi_mixer`).

Weight slots of a gated short convolution layer i (C channels, C = H): ``layers.i.short.in_proj.weight``
[3 C, H] (rows: the input gate B, the output gate C, then x), optional ``layers.i.short.in_proj.bias``
[3 C], ``layers.i.short.conv.weight`` [C, conv_kernel], ``layers.i.short.conv.bias`` [C] (zeros when the
checkpoint has none), ``layers.i.short.out.weight`` [H, C], optional ``layers.i.short.out.bias``. Per
token: y = C conv(B x) (the convolution over the gated inputs B x, its window in the state row), then
out(y) (`helios.ignition.short_conv`).
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
    # False (Falcon-H1's mamba_rms_norm false): the scan output is gated, y * silu(z), and not normed;
    # the layer then has no ``mixer.norm`` slot.
    gated_norm: bool = True
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

    @property
    def state_shape(self) -> tuple[int, int, int]:
        """One state row's float32 recurrent state (the ``ssm_state`` plane's trailing dims)."""
        return (self.num_heads, self.head_dim, self.state_size)

    def problems(self, num_layers: int) -> list[str]:
        """Invariant violations (empty when the geometry is consistent)."""
        found = layer_problems(self.layers, num_layers, "recurrent")
        if self.num_groups < 1 or self.num_heads % self.num_groups:
            found.append(f"{self.num_heads} mixer heads are not a multiple of {self.num_groups} groups")
        if self.conv_kernel < 2:
            found.append("the mixer convolution needs at least 2 taps")
        return found


@dataclass(frozen=True)
class GatedDeltaNetGeometry:
    """Which layers are Gated DeltaNet linear-attention layers and their extents (module docstring);
    under tensor parallelism one rank's key heads and their value heads (`helios.ignition.sharding`)."""

    layers: tuple[int, ...]
    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    # OLMo Hybrid: beta = beta_scale sigmoid(b) (its allow_neg_eigval: 2, writes of strength up to 2) and
    # the output norm's own epsilon (None: the Architecture's rms_norm_eps)
    beta_scale: float = 1.0
    norm_eps: float | None = None

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def projection(self) -> int:
        return self.conv_dim + self.value_dim + 2 * self.num_value_heads

    @property
    def state_shape(self) -> tuple[int, int, int]:
        """One state row's float32 recurrent state (the ``ssm_state`` plane's trailing dims)."""
        return (self.num_value_heads, self.key_head_dim, self.value_head_dim)

    def problems(self, num_layers: int) -> list[str]:
        """Invariant violations (empty when the geometry is consistent)."""
        found = layer_problems(self.layers, num_layers, "linear-attention")
        if min(self.num_key_heads, self.num_value_heads, self.key_head_dim, self.value_head_dim) < 1:
            found.append("linear-attention heads and head dims must be positive")
        elif self.num_value_heads % self.num_key_heads:
            found.append(f"{self.num_value_heads} linear-attention value heads are not a multiple of "
                         f"{self.num_key_heads} key heads")
        if self.conv_kernel < 2:
            found.append("the linear-attention convolution needs at least 2 taps")
        if not (math.isfinite(self.beta_scale) and self.beta_scale > 0):
            found.append(f"linear-attention beta_scale {self.beta_scale} must be finite and positive")
        if self.norm_eps is not None and not (math.isfinite(self.norm_eps) and self.norm_eps > 0):
            found.append(f"linear-attention norm_eps {self.norm_eps} must be finite and positive")
        return found


@dataclass(frozen=True)
class ShortConvGeometry:
    """Which layers are gated short convolutions (LFM2) and their extents (module docstring); under
    tensor parallelism one rank's share of the channels."""

    layers: tuple[int, ...]
    channels: int
    conv_kernel: int
    bias: bool = False

    @property
    def conv_dim(self) -> int:
        return self.channels

    @property
    def projection(self) -> int:
        return 3 * self.channels

    @property
    def state_shape(self) -> tuple[int, int, int]:
        """A one-element placeholder: the convolution window (``conv_state``) is the layer's whole state."""
        return (1, 1, 1)

    def problems(self, num_layers: int) -> list[str]:
        """Invariant violations (empty when the geometry is consistent)."""
        found = layer_problems(self.layers, num_layers, "short convolution")
        if self.channels < 1:
            found.append("the short convolution needs at least one channel")
        if self.conv_kernel < 2:
            found.append("the short convolution needs at least 2 taps")
        return found


@dataclass(frozen=True)
class KimiDeltaGeometry:
    """Which layers are Kimi Delta Attention layers and their extents (module docstring)."""

    layers: tuple[int, ...]
    num_heads: int
    head_dim: int
    conv_kernel: int
    # False (Bailing hybrid): the forget and output gates are full-rank projections ``f`` / ``g`` [qkv_dim, hidden]
    low_rank_gates: bool = True
    # < 0 (Bailing hybrid's safe gate): g = lower_bound sigmoid(-A (f x + dt_bias)), in (lower_bound, 0)
    lower_bound: float = 0.0

    @property
    def qkv_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return 3 * self.qkv_dim

    @property
    def projection(self) -> int:
        return self.conv_dim + self.num_heads

    @property
    def state_shape(self) -> tuple[int, int, int]:
        """One state row's float32 recurrent state (the ``ssm_state`` plane's trailing dims)."""
        return (self.num_heads, self.head_dim, self.head_dim)

    def problems(self, num_layers: int) -> list[str]:
        """Invariant violations (empty when the geometry is consistent)."""
        found = layer_problems(self.layers, num_layers, "linear-attention")
        if min(self.num_heads, self.head_dim) < 1:
            found.append("linear-attention heads and head dims must be positive")
        if self.conv_kernel < 2:
            found.append("the linear-attention convolution needs at least 2 taps")
        if not (math.isfinite(self.lower_bound) and self.lower_bound <= 0):
            found.append(f"the linear-attention gate's lower_bound {self.lower_bound} must be finite and <= 0")
        return found


def layer_problems(layers: tuple[int, ...], num_layers: int, kind: str) -> list[str]:
    """The layer-list violations every geometry checks: `layers` distinct, at least one, in range."""
    found = []
    if not layers or len(set(layers)) != len(layers):
        found.append(f"{kind} layers must be distinct and at least one")
    if any(not 0 <= layer < num_layers for layer in layers):
        found.append(f"{kind} layers {layers} lie outside 0..{num_layers - 1}")
    return found


def mixer_slots(arch, prefix: str, slot) -> list:
    """Weight slots of one recurrent layer (see the module docstring); `slot(name, *shape)` makes one."""
    if isinstance(arch.recurrent, GatedDeltaNetGeometry):
        return _delta_slots(arch, prefix, slot)
    if isinstance(arch.recurrent, ShortConvGeometry):
        return _short_conv_slots(arch, prefix, slot)
    if isinstance(arch.recurrent, KimiDeltaGeometry):
        return _kimi_slots(arch, prefix, slot)
    g: RecurrentGeometry = arch.recurrent
    p = prefix + "mixer."
    slots = [slot(p + "in_proj.weight", g.projection, arch.hidden_size)]
    if g.proj_bias:
        slots.append(slot(p + "in_proj.bias", g.projection))
    slots += [slot(p + "conv.weight", g.conv_dim, g.conv_kernel), slot(p + "conv.bias", g.conv_dim),
              slot(p + "dt_bias", g.num_heads), slot(p + "A", g.num_heads, dtype="float32"),
              slot(p + "D", g.num_heads)] + ([slot(p + "norm", g.intermediate)] if g.gated_norm else []) + [
              slot(p + "out.weight", arch.hidden_size, g.intermediate)]
    if g.out_bias:
        slots.append(slot(p + "out.bias", arch.hidden_size))
    return slots


def _delta_slots(arch, prefix: str, slot) -> list:
    g: GatedDeltaNetGeometry = arch.recurrent
    p = prefix + "delta."
    return [slot(p + "in_proj.weight", g.projection, arch.hidden_size),
            slot(p + "conv.weight", g.conv_dim, g.conv_kernel), slot(p + "conv.bias", g.conv_dim),
            slot(p + "dt_bias", g.num_value_heads), slot(p + "A", g.num_value_heads, dtype="float32"),
            slot(p + "norm", g.value_head_dim), slot(p + "out.weight", arch.hidden_size, g.value_dim)]


def _short_conv_slots(arch, prefix: str, slot) -> list:
    g: ShortConvGeometry = arch.recurrent
    p = prefix + "short."
    slots = [slot(p + "in_proj.weight", g.projection, arch.hidden_size)]
    if g.bias:
        slots.append(slot(p + "in_proj.bias", g.projection))
    slots += [slot(p + "conv.weight", g.conv_dim, g.conv_kernel), slot(p + "conv.bias", g.conv_dim),
              slot(p + "out.weight", arch.hidden_size, g.channels)]
    if g.bias:
        slots.append(slot(p + "out.bias", arch.hidden_size))
    return slots


def _kimi_slots(arch, prefix: str, slot) -> list:
    g: KimiDeltaGeometry = arch.recurrent
    p, hidden = prefix + "kda.", arch.hidden_size

    def gate(name: str) -> list:
        if g.low_rank_gates:
            return [slot(p + name + "_a.weight", g.head_dim, hidden), slot(p + name + "_b.weight", g.qkv_dim, g.head_dim)]
        return [slot(p + name + ".weight", g.qkv_dim, hidden)]

    return [slot(p + "in_proj.weight", g.projection, hidden), slot(p + "conv.weight", g.conv_dim, g.conv_kernel),
            slot(p + "conv.bias", g.conv_dim), *gate("f"), slot(p + "dt_bias", g.qkv_dim, dtype="float32"),
            slot(p + "A", g.num_heads, dtype="float32"), *gate("g"), slot(p + "norm", g.head_dim),
            slot(p + "out.weight", hidden, g.qkv_dim)]
