"""`freeze_startup_heap` (run by each serving process when it is ready): what exists then is frozen
out of the cyclic collector's traversals, and the collector still finds cycles made later. Run in a
child interpreter, since it is process-wide."""

from __future__ import annotations

import subprocess
import sys

PREAMBLE = """
import gc, weakref
from helios.server.heap import freeze_startup_heap, frozen_heap

class Node:
    pass

def cycle():
    node = Node()
    node.self = node
    return node
"""

CHECK = PREAMBLE + """
startup = cycle()  # a startup cycle: frozen, never collected
frozen = freeze_startup_heap()
assert frozen == gc.get_freeze_count() > 1000, frozen
assert gc.isenabled()
alive = weakref.ref(cycle())
gc.collect()
assert alive() is None, "a cycle made after the freeze was not collected"
print("ok", frozen)
"""


def _passes_in_a_child(code: str) -> None:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok ")


def test_startup_objects_are_frozen_and_later_cycles_still_collected():
    _passes_in_a_child(CHECK)


FROZEN_BLOCK = PREAMBLE + """
alive = weakref.ref(cycle())  # a cycle from before the block: frozen in it, collectable after it
with frozen_heap() as frozen:
    assert frozen > 1000 and gc.get_freeze_count() > 1000, frozen
    gc.collect()
    assert alive() is not None, "a frozen cycle was collected inside the block"
    made = weakref.ref(cycle())
    gc.collect()
    assert made() is None, "a cycle made inside the block was not collected"
assert gc.get_freeze_count() == 0
gc.collect()
assert alive() is None, "a cycle frozen by the block was not collected after it"
print("ok", frozen)
"""


def test_a_frozen_block_unfreezes_what_it_froze():
    _passes_in_a_child(FROZEN_BLOCK)
