"""The GPU's SM clock, power and throttle reasons while a benchmark runs, per named phase.

`ClockLog` runs ``nvidia-smi`` in a subprocess sampling every `interval_ms` (read-only queries: it
changes no setting) and tags each sample with the phase set last (`phase(label)`); `summary()`
gives per phase the sample count, median and lowest SM MHz, median and highest watts, and the
throttle reasons seen. Why: a decode step at 256 rows is compute-bound, and a run of seconds can
hold the device at a lower clock than a timing of a few milliseconds (power or thermal limits), so
a measurement says under which clock it was taken. Without ``nvidia-smi`` the log stays empty.

    with ClockLog() as clocks:
        clocks.phase("F.linear")
        ...
    for line in clocks.describe(): print(line)
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
import time

FIELDS = ("clocks.sm", "power.draw", "temperature.gpu", "clocks_throttle_reasons.active")
_REASONS = {0x1: "idle", 0x2: "app-clocks", 0x4: "sw-power-cap", 0x8: "hw-slowdown", 0x20: "sw-thermal",
            0x40: "hw-thermal", 0x80: "hw-power-brake"}


class ClockLog:
    def __init__(self, interval_ms: int = 100, index: int = 0):
        self.interval_ms, self.index = interval_ms, index
        self.samples: list[tuple[float, str, float, float, float, int]] = []
        self._label = "start"
        self._process = None
        self._reader = None

    def __enter__(self) -> "ClockLog":
        binary = shutil.which("nvidia-smi")
        if binary is None:
            return self
        command = [binary, f"--id={self.index}", f"--query-gpu={','.join(FIELDS)}",
                   "--format=csv,noheader,nounits", f"-lms={self.interval_ms}"]
        self._process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
            self._reader.join(timeout=5)

    def phase(self, label: str) -> None:
        """Samples from now on belong to `label`."""
        self._label = label

    def _read(self) -> None:
        for line in self._process.stdout:
            parts = [part.strip() for part in line.split(",")]
            try:
                sm, watts, celsius = float(parts[0]), float(parts[1]), float(parts[2])
                reasons = int(parts[3], 16)
            except (ValueError, IndexError):
                continue
            self.samples.append((time.perf_counter(), self._label, sm, watts, celsius, reasons))

    def summary(self) -> dict[str, dict]:
        phases: dict[str, list] = {}
        for _, label, *values in self.samples:
            phases.setdefault(label, []).append(values)
        return {label: _summary(rows) for label, rows in phases.items()}

    def window(self, start: float, end: float) -> dict | None:
        """The summary of the samples taken between `start` and `end` (``time.perf_counter()``)."""
        rows = [values for stamp, _, *values in self.samples if start <= stamp <= end]
        return _summary(rows) if rows else None

    def describe(self) -> list[str]:
        if not self.samples:
            return ["clocks: no samples (nvidia-smi not found or no output)"]
        return [f"clocks {label}: {describe(s)}" for label, s in self.summary().items()]


def describe(s: dict) -> str:
    return (f"{s['samples']} samples, SM {s['sm_mhz_median']:.0f} MHz median ({s['sm_mhz_min']:.0f} lowest), "
            f"{s['watts_median']:.0f} W median ({s['watts_max']:.0f} highest), {s['celsius_max']:.0f} C, "
            f"throttle reasons: {', '.join(s['reasons']) or 'none'}")


def _summary(rows: list) -> dict:
    mask = 0
    for row in rows:
        mask |= row[3]
    return {"samples": len(rows), "sm_mhz_median": statistics.median(r[0] for r in rows),
            "sm_mhz_min": min(r[0] for r in rows), "watts_median": statistics.median(r[1] for r in rows),
            "watts_max": max(r[1] for r in rows), "celsius_max": max(r[2] for r in rows),
            "reasons": [name for bit, name in _REASONS.items() if mask & bit]}
