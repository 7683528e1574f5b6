"""`freeze_startup_heap` (run by each serving process when it is ready): what exists then is frozen
out of the cyclic collector's traversals, and the collector still finds cycles made later. Run in a
child interpreter, since it is process-wide."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import gc, weakref
from helios.server.heap import freeze_startup_heap

class Node:
    pass

startup = Node()
startup.self = startup  # a startup cycle: frozen, never collected
frozen = freeze_startup_heap()
assert frozen == gc.get_freeze_count() > 1000, frozen
assert gc.isenabled()
later = Node()
later.self = later
alive = weakref.ref(later)
del later
gc.collect()
assert alive() is None, "a cycle made after the freeze was not collected"
print("ok", frozen)
"""


def test_startup_objects_are_frozen_and_later_cycles_still_collected():
    result = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok ")

