"""Wall-clock stack sampling of one thread: where a multi-threaded stage's thread spends its time.

cProfile cannot tell this on Python 3.12: it records every thread's calls in one profile (its events
come from `sys.monitoring`, which is per interpreter), so a function's "own time" on the loading
thread mixes in what the weight threads did meanwhile. `StackSampler` instead reads the sampled
thread's stack every ``interval`` seconds (`sys._current_frames`) from a thread of its own and counts,
per function, the samples it was on the stack (inclusive) and on top (leaf). A sample is taken when
the sampler gets the GIL, so time the thread spends holding it is seen at its switch points; the
sampler shortens the switch interval while it runs so that those come often.

    with StackSampler(threading.main_thread()) as sampler:
        work()
    print(sampler.report(rows=25))
"""

from __future__ import annotations

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
        while not self._stop.wait(self.interval):
            frame = sys._current_frames().get(self.thread_id)
            if frame is None:
                continue
            seen = set()
            top = True
            while frame is not None:
                code = frame.f_code
                name = f"{_short(code.co_filename)}:{code.co_firstlineno}({code.co_name})"
                if top:
                    self.leaf[name] += 1
                    top = False
                if name not in seen:  # recursion counts once
                    seen.add(name)
                    self.inclusive[name] += 1
                frame = frame.f_back
            self.samples += 1

    def report(self, rows: int = 25, title: str = "") -> str:
        """The `rows` functions with the most samples on the stack and on top, as shares of the
        samples and as seconds of the sampled span."""
        if not self.samples:
            return f"--- {title}: no samples"
        per_sample = self.seconds / self.samples
        lines = [f"--- {title}: {self.samples} samples over {self.seconds:.1f} s (one per {1e3 * per_sample:.1f} ms)"]
        for label, counts in (("on the stack", self.inclusive), ("on top", self.leaf)):
            lines.append(f"  {label}:")
            for name, count in counts.most_common(rows):
                lines.append(f"    {100 * count / self.samples:5.1f}%  {count * per_sample:6.2f} s  {name}")
        return "\n".join(lines)


def _short(path: str) -> str:
    for marker in ("/site-packages/", "/src/", "/lib/python"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path
