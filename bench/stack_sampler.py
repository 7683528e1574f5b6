"""Wall-clock stack sampling of one thread: where a multi-threaded stage's thread spends its time.

cProfile cannot tell this on Python 3.12: it records every thread's calls in one profile (its events
come from `sys.monitoring`, which is per interpreter), so a function's "own time" on the loading
thread mixes in what the weight threads did meanwhile. `StackSampler` instead reads the sampled
thread's stack every ``interval`` seconds (`sys._current_frames`) from a thread of its own and adds,
per function, the wall time it was on the stack (inclusive) and on top (leaf). A sample is taken when
the sampler gets the GIL, so while the load's threads hold it samples come late: each sample is
weighted by the wall time since the previous one (not counted once), so a phase that holds the GIL is
not under-counted against one that waits without it. The sampler shortens the switch interval
while it runs so that switch points come often.

    with StackSampler(threading.main_thread()) as sampler:
        work()
    print(sampler.report(rows=25))
"""

from __future__ import annotations

import linecache
import re
import sys
import threading
import time
from collections import Counter


class StackSampler:
    """Samples `thread`'s stack while in the ``with`` block (module docstring)."""

    def __init__(self, thread: threading.Thread, interval: float = 0.002, switch_interval: float = 0.0005):
        self.thread_id = thread.ident
        self.interval, self.switch_interval = interval, switch_interval
        self.inclusive: Counter = Counter()
        self.leaf: Counter = Counter()
        self.calls: Counter = Counter()  # the top frame's line: the call it makes (a graph's op, a C function)
        self.samples = 0
        self.seconds = 0.0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._run, name="stack-sampler", daemon=True)
        self._saved_switch = None

    def __enter__(self) -> "StackSampler":
        self._saved_switch = sys.getswitchinterval()
        sys.setswitchinterval(self.switch_interval)
        self._started = time.perf_counter()
        self._sampler.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._sampler.join()
        self.seconds = time.perf_counter() - self._started
        sys.setswitchinterval(self._saved_switch)

    def _run(self) -> None:
        last = time.perf_counter()
        while not self._stop.wait(self.interval):
            frame = sys._current_frames().get(self.thread_id)
            now = time.perf_counter()
            weight, last = now - last, now  # the wall time this sample stands for
            if frame is None:
                continue
            seen = set()
            top = True
            while frame is not None:
                code = frame.f_code
                name = f"{_short(code.co_filename)}:{code.co_firstlineno}({code.co_name})"
                if top:
                    self.leaf[name] += weight
                    self.calls[_call(frame)] += weight
                    top = False
                if name not in seen:  # recursion counts once
                    seen.add(name)
                    self.inclusive[name] += weight
                frame = frame.f_back
            self.samples += 1

    def report(self, rows: int = 25, title: str = "") -> str:
        """The `rows` functions with the most wall time on the stack and on top, in seconds and as
        shares of the sampled span."""
        if not self.samples:
            return f"--- {title}: no samples"
        lines = [f"--- {title}: {self.samples} samples over {self.seconds:.1f} s "
                 f"(one per {1e3 * self.seconds / self.samples:.1f} ms on average, each weighted by its wait)"]
        for label, seconds in (("on the stack", self.inclusive), ("on top", self.leaf),
                               ("on top, by the call its line makes", self.calls)):
            lines.append(f"  {label}:")
            for name, spent in seconds.most_common(rows):
                lines.append(f"    {100 * spent / self.seconds:5.1f}%  {spent:6.2f} s  {name}")
        return "\n".join(lines)


_CALLEE = re.compile(r"([A-Za-z_][\w.]*)\(")


def _call(frame) -> str:
    """What the frame's current line calls (its first callee: a generated graph's line names its op),
    else the line itself, shortened; the frame's file and line where the source is unknown."""
    code = frame.f_code
    text = linecache.getline(code.co_filename, frame.f_lineno, frame.f_globals).strip()
    if not text:
        return f"{_short(code.co_filename)}:{frame.f_lineno}"
    callee = _CALLEE.search(text.split("=", 1)[1] if " = " in text else text)
    if not callee:
        return text[:80]
    name = callee.group(1)
    return name if name.startswith("torch.") or "." not in name else "." + name.rsplit(".", 1)[1]  # a method


def _short(path: str) -> str:
    for marker in ("/site-packages/", "/src/", "/lib/python"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path
