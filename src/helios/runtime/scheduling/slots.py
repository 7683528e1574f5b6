"""Request slots (the selected concurrency) and their generations.

A slot's generation grows each time the slot is handed out, so everything a packer remembers
about a slot (uploaded page-table length, admission values) is invalidated by a new generation.
"""

from __future__ import annotations

from collections import deque


class SlotTable:
    """`num_slots` slots; `acquire` returns (slot, generation) or None."""

    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self._free: deque[int] = deque(range(num_slots))
        self._generations = [0] * num_slots
        self._owners: list[str | None] = [None] * num_slots

    @property
    def num_free(self) -> int:
        return len(self._free)

    def owner(self, slot: int) -> str | None:
        return self._owners[slot]

    def acquire(self, owner: str) -> tuple[int, int] | None:
        if not self._free:
            return None
        slot = self._free.popleft()
        self._generations[slot] += 1
        self._owners[slot] = owner
        return slot, self._generations[slot]

    def release(self, slot: int) -> None:
        self._owners[slot] = None
        self._free.append(slot)

    def free_slots(self) -> set[int]:
        return set(self._free)
