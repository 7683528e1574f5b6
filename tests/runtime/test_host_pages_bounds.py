"""Offload preemption's host page slots (`--host-pages N`) are checked against the host's
available memory before they are allocated, and an allocator failure for them is the same typed
load error: one line and exit 8 from `helios generate`, never a traceback."""

from __future__ import annotations

import pytest

from helios.cli.main import main
from helios.runtime.execution import history_storage
from helios.runtime.execution.history_storage import model_storage
from helios.runtime.loading import memory_budget
from helios.runtime.loading.memory_budget import InsufficientMemoryError
from helios.runtime.loading.model import LoadOptions, load_model
from runtime.test_model_fixture import CORE, KEY, NAMESPACE, open_fixture


@pytest.fixture(scope="module")
def loaded():
    return load_model(open_fixture(), LoadOptions(num_pages=8, cpu_kernels=False))


def _slot_nbytes(loaded) -> int:
    """Bytes of one host slot, from a storage of one slot (what the check multiplies)."""
    pages, state = model_storage(loaded, 1).planes(history_storage.StorageKind.HOST)
    return sum(p.tensor.numel() * p.tensor.element_size() for p in pages + state)


def _no_host_allocation(monkeypatch):
    real = history_storage._rows_like

    def rows_like(plane, rows, host=False):
        if host and rows:
            pytest.fail("host rows were allocated")
        return real(plane, rows, host)

    monkeypatch.setattr(history_storage, "_rows_like", rows_like)


def test_host_pages_beyond_the_available_memory_are_refused_before_allocating(loaded, monkeypatch):
    per_slot = _slot_nbytes(loaded)
    assert per_slot > 0
    monkeypatch.setattr(memory_budget, "available_memory_nbytes", lambda: 100 * per_slot)
    _no_host_allocation(monkeypatch)
    with pytest.raises(InsufficientMemoryError) as raised:
        model_storage(loaded, 1000)
    message = str(raised.value)
    assert message == (f"--host-pages 1000: the host page slots need {1000 * per_slot} bytes of host memory; "
                       f"{100 * per_slot} bytes are available (fewer host pages: --host-pages N)")
    assert "\n" not in message


def test_host_pages_that_fit_exactly_are_allocated(loaded, monkeypatch):
    per_slot = _slot_nbytes(loaded)
    monkeypatch.setattr(memory_budget, "available_memory_nbytes", lambda: 3 * per_slot)
    pages, _ = model_storage(loaded, 3).planes(history_storage.StorageKind.HOST)
    assert pages and all(p.tensor.shape[p.dim] == 3 for p in pages)


def test_unknown_available_memory_skips_the_check(loaded, monkeypatch):
    monkeypatch.setattr(memory_budget, "available_memory_nbytes", lambda: None)
    assert model_storage(loaded, 2).host_slots == 2


@pytest.mark.parametrize("failure", [RuntimeError("DefaultCPUAllocator: can't allocate memory"), MemoryError()])
def test_the_allocators_own_failure_is_the_same_typed_error(loaded, monkeypatch, failure):
    real = history_storage._rows_like

    def rows_like(plane, rows, host=False):
        if host:
            raise failure
        return real(plane, rows, host)

    monkeypatch.setattr(memory_budget, "available_memory_nbytes", lambda: None)
    monkeypatch.setattr(history_storage, "_rows_like", rows_like)
    with pytest.raises(InsufficientMemoryError, match=r"^--host-pages 5: the host page slots need \d+ bytes of host "
                                                      r"memory; the allocator could not hold them \(fewer host pages"):
        model_storage(loaded, 5)


def test_generate_with_too_many_host_pages_prints_one_line_and_exits_8(monkeypatch, capsys):
    monkeypatch.setattr(memory_budget, "available_memory_nbytes", lambda: 10**10)  # the machine's, made fixed
    _no_host_allocation(monkeypatch)
    code = main(["generate", str(CORE), "--accept", NAMESPACE, "--trust", str(KEY) + ".pub", "--prompt-ids",
                 "[[1, 2, 3]]", "--max-tokens", "2", "--pages", "8", "--host-pages", "1000000000",
                 "--preemption", "offload"])
    captured = capsys.readouterr()
    assert code == 8 and captured.out == ""
    errors = [line for line in captured.err.splitlines() if "error" in line.lower()]
    assert errors == [captured.err.splitlines()[-1]]
    assert errors[0].startswith("helios generate: error: --host-pages 1000000000: the host page slots need ")
    assert "10000000000 bytes are available" in errors[0] and "Traceback" not in captured.err


def test_snapshot_rows_beyond_the_available_memory_are_refused_before_allocating(loaded, monkeypatch):
    """`--snapshot-capacity 2000000000` was the allocator's RuntimeError (a traceback, exit 1) for
    the continuation rows; now one typed error names the option before anything is allocated."""
    monkeypatch.setattr(memory_budget, "available_memory_nbytes", lambda: 1 << 20)
    real = history_storage._rows_like

    def rows_like(plane, rows, host=False):
        if rows >= 2_000_000_000:
            pytest.fail("the snapshot rows were allocated")
        return real(plane, rows, host)

    monkeypatch.setattr(history_storage, "_rows_like", rows_like)
    with pytest.raises(InsufficientMemoryError, match=r"^--snapshot-capacity 2000000000: the snapshot rows need \d+ "
                                                      r"bytes on cpu; 1048576 bytes are available \(fewer snapshot"):
        model_storage(loaded, 0, continuation_rows=2_000_000_000)


def test_the_allocators_own_failure_for_snapshot_rows_is_the_same_typed_error(loaded, monkeypatch):
    real = history_storage._rows_like

    def rows_like(plane, rows, host=False):
        if rows == 7 and not host:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory")
        return real(plane, rows, host)

    monkeypatch.setattr(memory_budget, "available_memory_nbytes", lambda: None)
    monkeypatch.setattr(history_storage, "_rows_like", rows_like)
    with pytest.raises(InsufficientMemoryError, match=r"^--snapshot-capacity 7: the snapshot rows need \d+ bytes on "
                                                      r"cpu; the allocator could not hold them"):
        model_storage(loaded, 0, continuation_rows=7)
