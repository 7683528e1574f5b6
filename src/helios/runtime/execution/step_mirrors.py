"""Pinned host mirrors of the buffers a step rewrites, and their upload (the packer's staging,
`helios.runtime.execution.pack_staging`).

Two sets of mirrors, one per execution frame. When the staged device buffers lie in one step arena
(`helios.runtime.loading.step_arena`: a device model's loader puts them there), each set is one
pinned allocation with the arena's layout, and `upload` copies every run of neighbouring buffers
the step wrote with one asynchronous copy: usually the whole step in one copy, where separate
buffers take one each. Only neighbours are merged (the bytes between them are alignment padding
nothing reads): a buffer the step did not write is never copied, since this frame's mirror of it
may be older than what the other frame uploaded. Without an arena (host buffers staged for tests,
a foreign allocation) each buffer has its own mirror and copy.

Thread ownership: the packer's (one model worker); not thread-safe.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

from helios.runtime.loading.step_arena import ALIGN, arena_view


class StepMirrors:
    """The two frames' mirrors of the staged buffers `names` of `buffers` (module docstring)."""

    def __init__(self, buffers: Mapping[str, torch.Tensor], names: Sequence[str], pinned: bool):
        self._buffers = buffers
        arena = arena_of([buffers[name] for name in names])
        self.arena = arena is not None
        if arena is None:
            self.sets = [{name: torch.zeros(buffers[name].shape, dtype=buffers[name].dtype, pin_memory=pinned)
                          for name in names} for _ in range(2)]
            self._hosts: list[torch.Tensor] = []
            self._spans: list[tuple[int, int, str]] = []
            return
        self._device, offsets = arena
        self._hosts = [torch.zeros(self._device.numel(), dtype=torch.uint8, pin_memory=pinned) for _ in range(2)]
        self.sets = [{name: arena_view(host, offset, buffers[name]) for name, offset in zip(names, offsets)}
                     for host in self._hosts]
        self._spans = sorted((offset, offset + _nbytes(buffers[name]), name) for name, offset in zip(names, offsets))

    def upload(self, frame: int, dirty: set[str]) -> int:
        """Copies frame `frame`'s mirrors of the `dirty` buffers to the device buffers (asynchronous,
        on the current stream); returns the copies issued."""
        mirrors = self.sets[frame % 2]
        if not self._hosts:
            for name in sorted(dirty):
                self._buffers[name].copy_(mirrors[name], non_blocking=True)
            return len(dirty)
        host = self._hosts[frame % 2]
        copies = 0
        for start, end in self.runs(dirty):
            self._device[start:end].copy_(host[start:end], non_blocking=True)
            copies += 1
        return copies

    def runs(self, dirty: set[str]) -> list[tuple[int, int]]:
        """Byte ranges of the arena to copy: each a run of neighbouring dirty buffers."""
        runs: list[list[int]] = []
        previous = None
        for start, end, name in self._spans:
            if name in dirty:
                if runs and previous is not None and previous[2] in dirty and start - previous[1] < ALIGN:
                    runs[-1][1] = end
                else:
                    runs.append([start, end])
            previous = (start, end, name)
        return [(start, end) for start, end in runs]


def arena_of(tensors: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[int]] | None:
    """(a byte tensor over the one allocation every tensor of `tensors` lies in, each tensor's byte
    offset in it) when they are contiguous, non-overlapping views of one allocation; else None
    (``meta`` tensors, which have no memory, never are)."""
    if not tensors or any(t.device.type == "meta" or not t.is_contiguous() for t in tensors):
        return None
    storages = {t.untyped_storage().data_ptr() for t in tensors}
    if len(storages) != 1:
        return None
    storage = tensors[0].untyped_storage()
    offsets = [t.data_ptr() - storage.data_ptr() for t in tensors]
    spans = sorted((offset, offset + _nbytes(t)) for offset, t in zip(offsets, tensors))
    if any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:])):
        return None
    whole = torch.empty(0, dtype=torch.uint8, device=tensors[0].device).set_(storage, 0, (storage.nbytes(),), (1,))
    return whole, offsets


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
