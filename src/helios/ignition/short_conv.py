"""The gated short convolution layer of a hybrid decoder (LFM2's ShortConv) over one packed step.

Weight slots and geometry: `helios.ignition.recurrent_geometry` (``layers.i.short.*``). Per token: one
projection gives the input gate B, the output gate C and x; the gated inputs B x go through the
causal depthwise convolution (``helios::causal_conv_update``, its window in the row's ``conv_state``,
no activation), the result is gated by C and projected by ``out`` (under tensor parallelism each
rank's channels, the ranks' outputs summed by one all-reduce). The layer's ``ssm_state`` row is a
placeholder it never touches. The arithmetic mirrors transformers' Lfm2ShortConv.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import helios.abi.recurrent  # noqa: F401  (registers helios::causal_conv_update)
from helios.ignition.architecture import Architecture
from helios.ignition.recurrent_geometry import ShortConvGeometry
from helios.ignition.tensor_parallel import row_parallel_linear


def short_conv_block(arch: Architecture, w, prefix: str, hidden: torch.Tensor, planes, step, state) -> torch.Tensor:
    """The gated short convolution's output [T, H]; advances the rows' convolution window in place.
    `planes` = (this layer's conv_state, its unused ssm_state); `step` a PackedStep, `state` a RowState."""
    g: ShortConvGeometry = arch.recurrent
    p = prefix + "short."
    conv_plane, _ = planes
    projected = F.linear(hidden, w[p + "in_proj.weight"], w.get(p + "in_proj.bias"))
    b, c, x = projected.split([g.channels, g.channels, g.channels], dim=-1)
    convolved = torch.ops.helios.causal_conv_update(
        conv_plane, (b * x).contiguous(), w[p + "conv.weight"], w[p + "conv.bias"], step.query_start, state.rows,
        state.fresh, state.max_query_len)
    return row_parallel_linear(arch, c * convolved, w[p + "out.weight"], w.get(p + "out.bias"))
