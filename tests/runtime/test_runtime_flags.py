"""`serve`/`generate` startup flags (pages, snapshots, speculation width, history drafting, offload
preemption) reach the runtime, bad values are usage errors, CUDA page sizing from free memory, the
CPU default bounded by the available memory, and a CPU page count that memory cannot hold refused
before anything is allocated."""

from __future__ import annotations

import argparse
import json
import logging

import pytest
import torch

from helios.cli.main import main
from helios.cli.runtime_flags import add_runtime_flags, runtime_flags
from helios.contract import StartupOptions
from helios.runtime.loading import memory_budget, model, page_sizing
from helios.runtime.loading.memory_budget import InsufficientMemoryError
from helios.runtime.loading.model import LoadOptions, load_model
from helios.runtime.loading.page_sizing import (
    CacheMemoryError, default_pages, other_bytes, page_bytes, pages_for_memory,
)
from runtime.test_hybrid_runtime import NAMESPACE, PROMPTS, STEPS, expected, hybrid  # noqa: F401 (fixtures)
from runtime.test_model_fixture import open_fixture


def _generate(hybrid, capsys, *flags):  # noqa: F811
    root, _ = hybrid
    code = main(["generate", str(root / "model.core"), "--accept", NAMESPACE, "--trust",
                 str(root / "publisher.key.pub"), "--prompt-ids", json.dumps(PROMPTS), "--max-tokens", str(STEPS),
                 "--ignore-eos", "--json", *flags])
    captured = capsys.readouterr()
    tokens = [json.loads(line)["token_ids"] for line in captured.out.splitlines() if line.startswith("{")]
    return code, tokens, captured.err


def test_generate_with_offload_preemption_flags_gives_the_reference_tokens(hybrid, expected, capsys):  # noqa: F811
    code, tokens, _ = _generate(hybrid, capsys, "--pages", "17", "--preemption", "offload", "--host-pages", "32",
                                "--snapshot-capacity", "4", "--no-history-drafting", "--no-logprobs")
    assert code == 0
    assert tokens == expected


@pytest.mark.parametrize("flags, loaded", [([], None), (["--no-logprobs"], False)])
def test_no_logprobs_reaches_the_startup_options(flags, loaded):
    parser = argparse.ArgumentParser()
    add_runtime_flags(parser)
    load, _, _ = runtime_flags(parser.parse_args(flags), StartupOptions(), "cpu")
    assert load.startup.token_logprobs is loaded


@pytest.mark.parametrize("flags, workers", [([], None), (["--compile-workers", "0"], 0),
                                            (["--compile-workers", "3"], 3)])
def test_compile_workers_reach_the_load_options(flags, workers):
    parser = argparse.ArgumentParser()
    add_runtime_flags(parser)
    load, _, _ = runtime_flags(parser.parse_args(flags), StartupOptions(), "cuda")
    assert load.compile_workers == workers


@pytest.mark.parametrize("flags, message", [
    (["--compile-workers", "-1"], "--compile-workers must not be negative"),
    (["--preemption", "offload"], "--host-pages"),
    (["--pages", "0"], "--pages"),
    (["--memory-fraction", "1.5"], "--memory-fraction"),
    (["--image-cache-images", "0"], "--image-cache-images must be positive"),
    (["--speculative-width", "4"], "--speculative-width: 4 is not a prepared width"),
    (["--history-drafting"], "--history-drafting: history drafting requires"),
])
def test_bad_flag_values_are_usage_errors(hybrid, capsys, flags, message):  # noqa: F811
    code, tokens, err = _generate(hybrid, capsys, *flags)
    assert code == 2 and tokens == []
    assert message in err


def test_pages_are_sized_from_free_memory_beside_the_other_buffers():
    prepared = open_fixture().prepared
    per_page, others = page_bytes(prepared), other_bytes(prepared, num_state_rows=4)
    assert per_page > 0
    free = others + 100 * per_page + per_page // 2
    assert pages_for_memory(prepared, free, 1.0, 4, min_pages=8) == 100
    assert pages_for_memory(prepared, 2 * free, 0.5, 4, min_pages=8) == (free - others) // per_page
    with pytest.raises(CacheMemoryError, match="one request needs 200"):
        pages_for_memory(prepared, free, 1.0, 4, min_pages=200)


def test_a_capture_out_of_memory_loads_again_with_a_lower_fraction_where_the_fraction_sized_the_pages(
        monkeypatch, caplog):
    from helios.runtime.loading.cuda_graphs import CaptureMemoryError

    tried = []

    def load(core, options, pages, compiler, succeed_at=3):
        tried.append(options.memory_fraction)
        if len(tried) < succeed_at:
            raise CaptureMemoryError("program decode_logprobs (batch 256) ran out of device memory")
        return "loaded"

    monkeypatch.setattr(model, "_load_model", load)
    with caplog.at_level(logging.WARNING, logger=model.__name__):
        assert load_model(None, LoadOptions(device="cpu")) == "loaded"
    assert tried == [0.85, 0.75, 0.65]
    assert "loading again with --memory-fraction 0.75" in caplog.text
    tried.clear()
    monkeypatch.setattr(model, "_load_model", lambda *a: load(*a, succeed_at=9))
    with pytest.raises(CaptureMemoryError, match=r"tried --memory-fraction 0\.90, 0\.80, 0\.70"):  # twice at most
        load_model(None, LoadOptions(device="cpu", memory_fraction=0.9))
    assert tried == [0.9, 0.8, 0.7]
    for options, pages in ((LoadOptions(device="cpu", num_pages=64), None), (LoadOptions(device="cpu"), lambda: 64)):
        tried.clear()  # pages the operator or rank zero chose: not this load's to change
        with pytest.raises(CaptureMemoryError):
            load_model(None, options, pages)
        assert tried == [0.85]
    tried.clear()  # the first try takes the fraction as given (0.004 was rounded to 0.0, refused after the load)
    monkeypatch.setattr(model, "_load_model", lambda *a: load(*a, succeed_at=1))
    assert load_model(None, LoadOptions(device="cpu", memory_fraction=0.004)) == "loaded"
    assert tried == [0.004]


def test_running_out_of_memory_in_the_capture_is_a_typed_error_with_its_remedy(monkeypatch):
    from helios.runtime.loading import cuda_graphs

    def out_of_memory(*_):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 252.00 MiB")

    monkeypatch.setattr(cuda_graphs, "_capture_module", out_of_memory)
    plan = cuda_graphs._Plan(program=None, name="decode_b256", main=(None, None), fresh=None, arguments=[])
    with pytest.raises(cuda_graphs.CaptureMemoryError, match="decode_b256 ran out of device memory.*--memory-fraction"):
        cuda_graphs._capture(plan, None, 1)
    assert issubclass(cuda_graphs.CaptureMemoryError, InsufficientMemoryError)

    class Captured:
        released = False

        def release(self):
            self.released = True

    main = Captured()

    def fresh_out_of_memory(variants, *_):  # the main graphs fit; the fresh-chunk variant does not
        if variants == ("fresh",):
            raise torch.OutOfMemoryError("CUDA out of memory")
        return main

    monkeypatch.setattr(cuda_graphs, "_capture_module", fresh_out_of_memory)
    plan = cuda_graphs._Plan(program=None, name="prefill_t2048", main=(None, None), fresh=("fresh",), arguments=[])
    with pytest.raises(cuda_graphs.CaptureMemoryError, match="prefill_t2048's fresh-chunk variant ran out"):
        cuda_graphs._capture(plan, None, 1)  # not left out with a warning: fewer pages make room for it
    assert main.released  # its graphs are not kept alive by the error's traceback


def test_the_cpu_default_is_the_cores_pages_or_as_many_as_the_available_memory_holds(monkeypatch, caplog):
    prepared = open_fixture().prepared
    per_page, others = page_bytes(prepared), other_bytes(prepared, num_state_rows=4)
    cpu = torch.device("cpu")

    def pages(available):
        monkeypatch.setattr(memory_budget, "available_memory_nbytes", lambda: available)
        return default_pages(prepared, cpu, 1.0, 4, min_pages=8, contract_pages=500)

    assert pages(None) == 500  # unknown: the core's
    assert pages(others + 500 * per_page) == 500  # they fit exactly
    with caplog.at_level(logging.WARNING, logger=page_sizing.__name__):
        assert pages(others + 100 * per_page + 7) == 100
    assert "the core's 500 cache pages" in caplog.text and "serving with 100 (--pages N to choose)" in caplog.text
    with pytest.raises(CacheMemoryError, match="one request needs 8"):
        pages(others + 7 * per_page)


def test_a_cpu_load_asking_for_more_pages_than_memory_holds_is_refused_before_allocating(monkeypatch):
    opened = open_fixture()
    per_page = page_bytes(opened.prepared)
    monkeypatch.setattr(memory_budget, "available_memory_nbytes", lambda: 1000 * per_page)
    monkeypatch.setattr(model, "_allocate", lambda *args, **kwargs: pytest.fail("allocated"))
    with pytest.raises(InsufficientMemoryError, match=r"2000 cache pages and the other buffers need .* \(fewer pages: --pages N\)"):
        load_model(opened, LoadOptions(num_pages=2000, cpu_kernels=False))


def test_a_page_pool_the_allocator_cannot_hold_is_a_typed_error(monkeypatch):
    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")

    monkeypatch.setattr(model, "_allocate", out_of_memory)  # what CUDA's allocator raises for an explicit count
    with pytest.raises(InsufficientMemoryError, match=r"30 cache pages .* more than its allocator found free "
                                                      r"\(fewer pages: --pages N\)"):
        load_model(open_fixture(), LoadOptions(num_pages=30, cpu_kernels=False))
