"""The engine process's grammar compiler, built on a thread once the process reported ready
(`helios.server.engine_grammars`): a request's grammar compiled there waits for the build and gives the
serving process's matcher; a failed build fails each request with a grammar, naming why; and the engine
process sends its ready record while the build is still running. Requests with grammars through a real
engine process are tests/server/test_engine_process.py's."""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest
from tokenizers import Tokenizer

from helios.frontend.structured.grammar import GrammarCompiler, GrammarKind, GrammarRequest
from helios.runtime.engine_link import Shutdown
from helios.runtime.feedback import TensorGrammar
from helios.server import engine_process
from helios.server.engine_grammars import EngineGrammars, GrammarCompilerUnavailableError
from support.engine_thread import start_engine_main

SCHEMA = '{"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}'
WAIT_S = 60  # a hang guard: every wait below ends as soon as what it waits for happens


@pytest.fixture(scope="module")
def vocab_size(tokenizer_json) -> int:
    return Tokenizer.from_str(tokenizer_json.decode("utf-8")).get_vocab_size()


@pytest.fixture(scope="module")
def serving(tokenizer_json, vocab_size) -> GrammarCompiler:
    """The serving process's compiler of the same tokenizer: what writes the sources the engine compiles."""
    tokenizer = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
    return GrammarCompiler.from_tokenizer(tokenizer, vocab_size=vocab_size, eos_token_ids=(0,))


def _held_build(monkeypatch) -> threading.Event:
    """Holds every grammar compiler build from here on until the returned event is set."""
    release = threading.Event()
    build = GrammarCompiler.from_tokenizer

    def held(*args, **kwargs) -> GrammarCompiler:
        release.wait(WAIT_S)
        return build(*args, **kwargs)

    monkeypatch.setattr(GrammarCompiler, "from_tokenizer", held)
    return release


def test_a_grammar_compiled_while_the_build_runs_waits_for_it_and_masks_as_the_serving_processes(
        tokenizer_json, vocab_size, serving, monkeypatch):
    release = _held_build(monkeypatch)
    grammars = EngineGrammars(tokenizer_json, vocab_size, (0,)).start()
    source = serving.grammar_text(GrammarRequest(GrammarKind.JSON_SCHEMA, SCHEMA))
    compiled: list = []
    waiting = threading.Thread(target=lambda: compiled.append(grammars.compile(source)))
    waiting.start()
    waiting.join(0.5)
    assert waiting.is_alive() and not compiled  # held by the build
    release.set()
    waiting.join(WAIT_S)
    assert not waiting.is_alive() and isinstance(compiled[0], TensorGrammar)
    ours, theirs = compiled[0]._matcher, serving.compile_source(source)
    assert np.array_equal(ours.bitmask(), theirs.bitmask())


def test_a_failed_build_fails_each_grammar_naming_why(vocab_size, serving):
    grammars = EngineGrammars(b"not a tokenizer", vocab_size, (0,)).start()
    source = serving.grammar_text(GrammarRequest(GrammarKind.REGEX, "[ab]+"))
    for _ in range(2):
        with pytest.raises(GrammarCompilerUnavailableError, match="could not build its grammar compiler: Exception"):
            grammars.compile(source)


def test_a_build_never_started_is_an_error_not_a_wait(tokenizer_json, vocab_size):
    with pytest.raises(GrammarCompilerUnavailableError, match="never started"):
        EngineGrammars(tokenizer_json, vocab_size, (0,)).compile('{"grammars": []}')


def test_the_engine_process_reports_ready_while_its_grammar_compiler_is_built(core, monkeypatch):
    # The engine process's main on a thread of this process, its pipe's other end here.
    release = _held_build(monkeypatch)
    main, ours = start_engine_main(core, monkeypatch)
    try:
        assert ours.poll(WAIT_S)
        assert isinstance(ours.recv(), engine_process._Ready)  # sent while the build is held
    finally:
        release.set()
        ours.send(Shutdown())
        main.join(WAIT_S)
    assert not main.is_alive()


DEEP_COMPILE = """
import json, sys
from helios.server.engine_grammars import EngineGrammars

tokenizer_json, vocab_size, depth = open(sys.argv[1], "rb").read(), int(sys.argv[2]), int(sys.argv[3])
chain = "\\n".join(f"a{i}: a{i + 1}" for i in range(depth))
source = json.dumps({"grammars": [{"lark_grammar": f"start: a0\\n{chain}\\na{depth}: \\"x\\"\\n"}]})
EngineGrammars(tokenizer_json, vocab_size, (0,)).start().compile(source)
print("compiled")
"""


def test_a_grammar_too_deep_for_the_main_threads_stack_compiles_on_the_compile_thread(tokenizer_json, vocab_size,
                                                                                     tmp_path):
    """A 3,000-rule chain overflows an 8 MiB stack in llguidance's recursive compile: on the engine process's
    command loop it ended the process with a segfault (the serving process had checked it on its large stack)."""
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_bytes(tokenizer_json)
    done = subprocess.run([sys.executable, "-c", DEEP_COMPILE, str(tokenizer), str(vocab_size), "3000"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.split() == ["compiled"], (done.returncode, done.stderr[-2000:])
