"""The serving process's tokenizer and grammar compiler built while its engine process loads
(`helios.server.frontend_ahead`): `ServedModel.from_runtime` takes them where they were built from
the bytes, vocabulary and end-of-sequence ids it would build them from, else builds its own; and
`start_engine_process` starts the build only once the engine process is ordered to load. Every
`helios serve` with an engine process (tests/e2e) serves through them."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from helios.core.reader import open_core
from helios.errors import ExecutionError
from helios.runtime.loading.model import LoadOptions, resource_of_kind
from helios.runtime.service import RuntimeOptions, build_runtime
from helios.server.engine_process import CoreSource, start_engine_process
from helios.server.engine_spawn import spawn_engine_process
from helios.server.frontend_ahead import FrontendAhead
from helios.server.service import ServedModel
from support.server_core import tiny_core
from support.spawn_probe import report_order


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    return tiny_core(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def opened(core):
    return open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key])


@pytest.fixture(scope="module")
def runtime(opened):
    runtime = build_runtime(opened, RuntimeOptions(LoadOptions(cpu_kernels=False), queue_capacity=4))
    yield runtime
    runtime.close()


def tokenizer_bytes(opened) -> bytes:
    return opened.read_resource(resource_of_kind(opened, "TOKENIZER"))


def served_with(runtime, ahead) -> ServedModel:
    served = ServedModel.from_runtime(runtime, queue_capacity=4, frontend_workers=1, ahead=ahead)
    served.output.close()  # never started: only its frontend is read here
    return served


def started(ahead: FrontendAhead) -> FrontendAhead:
    ahead.start()
    return ahead


def test_the_frontend_takes_the_parts_built_from_what_it_would_build_them_from(opened, runtime):
    model = runtime.model
    vocab_size, eos = model.prepared.sampled_range[1], model.settings.eos_token_ids
    ahead = started(FrontendAhead(lambda: tokenizer_bytes(opened), vocab_size, eos))
    served = served_with(runtime, ahead)
    tokenizer, grammar = ahead.parts_for(model.tokenizer_json, vocab_size, eos)
    assert served.frontend._tokenizer is tokenizer and served.frontend._grammar is grammar
    reference = Tokenizer.from_str(model.tokenizer_json.decode("utf-8"))
    assert tokenizer.encode("hello there").ids == reference.encode("hello there").ids


@pytest.mark.parametrize("other", ["bytes", "eos", "failed", "unstarted"])
def test_parts_built_from_other_inputs_or_not_built_are_not_taken(opened, runtime, other):
    model = runtime.model
    vocab_size, eos = model.prepared.sampled_range[1], tuple(model.settings.eos_token_ids)

    def read() -> bytes:
        if other == "failed":
            raise OSError("the resource could not be read")
        text = tokenizer_bytes(opened)
        return text.replace(b'"model"', b' "model"', 1) if other == "bytes" else text  # the same tokenizer, other bytes

    ahead = FrontendAhead(read, vocab_size, eos + (0,) if other == "eos" else eos)
    if other != "unstarted":
        ahead.start()
    served = served_with(runtime, ahead)
    assert ahead.parts_for(model.tokenizer_json, vocab_size, eos) is None
    assert served.frontend._tokenizer is not None and served.frontend._grammar is not None  # built its own


def test_the_build_starts_only_once_the_engine_process_is_ordered_to_load(core, opened):
    spawned = spawn_engine_process(report_order)
    seen = []
    source = CoreSource(str(core.path), core.namespace, (str(core.public_key),))
    with pytest.raises(ExecutionError, match="while starting"):  # the probe's reply is no ready record
        start_engine_process(source, opened.prepared, RuntimeOptions(), spawned=spawned,
                             while_loading=lambda: seen.append(spawned.ordered))
    assert seen == [True]
    assert not spawned.process.is_alive()
