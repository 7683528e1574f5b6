"""Which host buffers already hold a binding's values, so a step need not write them again.

A per-row binding whose values depend only on its rows' identity (request, slot, generation, query
length, whether the row samples) and on their requests' specs - slots, generations, seeds,
sampling parameters, output limits, EOS ids, state rows, constants - writes the same values for the
same rows. So does a grammar mask when no row is constrained (every row allows the vocabulary). A
decode cohort's steps repeat those rows, so the packer (`helios.runtime.execution.packer`) skips such
a write when its buffer still holds what the same binding wrote for the same rows.

`KeptValues` remembers, per buffer, the (binding, rows key) it holds. Every other write of a
buffer must `forget` it first (the packer's other sources, admission values, state resets, state
copies). A buffer some program writes is never remembered: it is written every step. A buffer
packed into staging mirrors (a device buffer; one pinned mirror per execution frame, uploaded with
the plan) is remembered by what its last upload left on the device: a step whose binding and rows
key match writes neither its frame's mirror nor uploads it (the device buffer already holds those
values, whichever frame uploaded them; uploads run in submission order on the stream, so the step's
program reads them). A write to a mirror is always followed by its upload, in the same pack. Only
bindings that write the whole buffer (submission rows, padded) are kept there: the rows past the
live ones of another binding hold what each frame's mirror last held, which differs by frame.

Thread ownership: the packer's (the model worker's).
"""

from __future__ import annotations

from operator import itemgetter
from typing import Iterable, Mapping, Sequence

import torch

from helios.contract import serving_pb2 as spb
from helios.runtime.loading.step_arena import KEYED_SOURCES
from helios.runtime.records.plan import PlanRow

S = spb

_ROW_INDEXING = {S.INDEXING_SUBMISSION_ROW, S.INDEXING_ACTIVE_ROW}


_ROW_KEY = itemgetter(*(PlanRow._fields.index(name) for name in
                         ("request_id", "slot", "generation", "query_len", "samples")))


def rows_key_of(rows: Sequence[PlanRow]) -> tuple:
    """What the keyed sources' values of `rows` depend on besides their requests' specs (a slot's
    generation changes whenever a request, the same id again included, takes the slot): each row's
    (request_id, slot, generation, query_len, samples)."""
    return tuple(map(_ROW_KEY, rows))


class KeptValues:
    """Per host buffer, the (binding, rows key) whose values it holds (see the module docstring)."""

    def __init__(self, buffers: Mapping[str, torch.Tensor], program_written: Iterable[str]):
        self._buffers = buffers
        self._program_written = frozenset(program_written)
        self._kept: dict[str, tuple[object, tuple]] = {}
        self._last_key: tuple = ()

    def interned(self, rows_key: tuple) -> tuple:
        """`rows_key`, or the equal key of the previous step (compared once here, then by identity
        in every `holds` of the step: a cohort's steps repeat their rows)."""
        if rows_key == self._last_key:
            return self._last_key
        self._last_key = rows_key
        return rows_key

    def holds(self, binding, target: torch.Tensor, rows_key: tuple, constrained: bool) -> bool:
        """Whether `target` (the binding's buffer itself: for a staged one, the device buffer its
        mirrors upload to) already holds what `binding` writes for rows of `rows_key`
        (`constrained`: some row is); when not, the caller writes it (and uploads it) and this
        remembers what the buffer then holds (or forgets it, for a binding not kept)."""
        name = binding.buffer_name
        keyed = binding.indexing in _ROW_INDEXING and (
            binding.source in KEYED_SOURCES or (binding.source == S.VALUE_SOURCE_GRAMMAR_MASK and not constrained))
        if not keyed or name in self._program_written or target is not self._buffers[name]:
            self._kept.pop(name, None)
            return False
        kept = self._kept.get(name)
        if kept is not None and kept[0] is binding and (kept[1] is rows_key or kept[1] == rows_key):
            return True
        self._kept[name] = (binding, rows_key)
        return False

    def forget(self, name: str) -> None:
        """Buffer `name` is about to be written otherwise: it holds nothing remembered."""
        self._kept.pop(name, None)

    def clear(self) -> None:
        """Nothing is remembered (a request was registered: an id's spec may have changed)."""
        self._kept.clear()
