"""Constants written once at load: the CONSTANT bindings of graphs no step packs."""

from __future__ import annotations

from typing import Mapping

import torch

from helios.contract import PreparedContract
from helios.contract import serving_pb2 as S

_UNPACKED_OPERATIONS = (S.GRAPH_OPERATION_TUNING, S.GRAPH_OPERATION_VISION)  # never packed per step


def write_constants(prepared: PreparedContract, buffers: Mapping[str, torch.Tensor]) -> None:
    """Writes the CONSTANT bindings of the graphs no step packs (TUNING producers, VISION encoders)
    once, at load, before any of them runs."""
    for graph in prepared.graphs.values():
        if graph.operation in _UNPACKED_OPERATIONS:
            for view in graph.bindings:
                if view.source == S.VALUE_SOURCE_CONSTANT and view.buffer in buffers:
                    buffers[view.buffer].fill_(view.constant)
