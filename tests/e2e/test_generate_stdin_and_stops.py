"""`helios generate` reading its prompt from standard input (`-`), and stopped mid-batch.

`-` was taken as the literal prompt "-"; it is now the whole of standard input (one final line end
dropped), refused in one line (exit 2, before anything loads) when standard input is empty,
closed, not UTF-8 or named twice. Ctrl-C or SIGTERM while the batch generated printed nothing
(results come at the end of the batch), or, for SIGTERM, ended the process with no line at all:
every prompt's output so far is now printed first, then one line and status 130 or 143. In
process through `main`, on the shared tiny prepared core."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import signal
import sys

import pytest

from helios.runtime.records.events import FinishEvent
from support.cli_runs import one_line, run_cli
from support.server_core import CONTEXT_TOKENS, tiny_core


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    return tiny_core(tmp_path_factory.getbasetemp())


def generate(core, *argv):
    return ["generate", core.path, "--accept", core.namespace, "--trust", core.public_key, *argv]


def stdin_of(monkeypatch, data: bytes | None) -> None:
    monkeypatch.setattr(sys, "stdin", None if data is None else io.TextIOWrapper(io.BytesIO(data)))


@pytest.fixture
def prompts_seen(monkeypatch):
    """The prompt texts `generate` reaches the core's opening with (it stops there)."""
    import helios.cli.generate_cmd as generate_cmd

    seen = []

    def opened(args):
        seen.append((args.core, args.prompts))
        raise generate_cmd.UsageError("stop before opening the core")

    monkeypatch.setattr(generate_cmd, "_open", opened)
    return seen


@pytest.mark.parametrize("data, prompts", [
    (b"Once upon a time\n", ["Once upon a time"]),
    (b"two\nlines\r\n", ["two\nlines"]),
    ("caf\u00e9 \u4e16\u754c".encode(), ["caf\u00e9 \u4e16\u754c"]),
])
def test_a_dash_prompt_is_the_whole_of_standard_input(core, prompts_seen, monkeypatch, data, prompts, capsys):
    stdin_of(monkeypatch, data)
    code, _, err = run_cli(capsys, *generate(core, "first", "-"))
    assert code == 2 and "stop before opening" in one_line(err)
    assert prompts_seen == [(str(core.path), ["first", *prompts])]


def test_a_dash_first_is_a_prompt_even_beside_a_file_named_dash(prompts_seen, tmp_path, monkeypatch, capsys):
    """`helios generate -` (the embedded model): a file named "-" in the working directory was taken
    for the core."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "-").write_text("not a core")
    stdin_of(monkeypatch, b"What is 2 + 3?\n")
    code, _, err = run_cli(capsys, "generate", "-")
    assert code == 2 and "stop before opening" in one_line(err)
    assert prompts_seen == [(None, ["What is 2 + 3?"])]


@pytest.mark.parametrize("data, argv, message", [
    (b"", ["-"], "standard input is empty: the prompt - is read from it"),
    (b"caf\xe9\n", ["-"], "the prompt -: standard input is not UTF-8 text (byte 3 is 0xe9)"),
    (None, ["-"], "the prompt - reads standard input, which is closed"),
    (b"twice\n", ["-", "-"], "the prompt - (standard input) is given more than once"),
])
def test_a_dash_prompt_that_cannot_be_read_is_one_line_before_anything_opens(core, prompts_seen, monkeypatch,
                                                                             data, argv, message, capsys):
    stdin_of(monkeypatch, data)
    code, out, err = run_cli(capsys, *generate(core, *argv))
    assert code == 2 and out == "" and one_line(err) == f"helios generate: error: {message}\n"
    assert prompts_seen == []


def test_a_dash_prompt_generates_as_the_same_text_given_as_an_argument(core, monkeypatch, capsys):
    argv = generate(core, "--max-tokens", "3", "--json")
    code, given, _ = run_cli(capsys, *argv, "hello there")
    assert code == 0
    stdin_of(monkeypatch, b"hello there\n")
    code, read, _ = run_cli(capsys, *argv, "-")
    assert code == 0 and read == given and json.loads(read)["prompt_ids"]


@pytest.fixture
def stopped_after_the_first_end(monkeypatch):
    """`generate`'s engine gets `stop()` called at its first step after one prompt ended."""
    import helios.cli.generate_cmd as generate_cmd

    stops = []
    real_build = generate_cmd.build_runtime

    def build(core, options):
        runtime = real_build(core, options)
        engine, ended = runtime.engine, []
        real_submit, real_step = engine.submit, engine.step

        def submit(request):
            def observed(event, on_event=request.on_event):
                if isinstance(event, FinishEvent):
                    ended.append(event.request_id)
                on_event(event)
            real_submit(dataclasses.replace(request, on_event=observed))

        def step():
            if ended:
                stops.pop()()
            return real_step()

        monkeypatch.setattr(engine, "submit", submit)
        monkeypatch.setattr(engine, "step", step)
        return runtime

    monkeypatch.setattr(generate_cmd, "build_runtime", build)
    return stops


def _interrupt():
    raise KeyboardInterrupt


def _sigterm():
    os.kill(os.getpid(), signal.SIGTERM)  # the handler `generate` installs raises here


@pytest.mark.parametrize("stop, code, word", [(_interrupt, 130, "interrupted"), (_sigterm, 143, "terminated")])
def test_a_stopped_batch_prints_every_prompt_so_far_then_one_line(core, stopped_after_the_first_end, monkeypatch,
                                                                   stop, code, word, capsys):
    """The long prompt (2 tokens left in its context) ends first; the short one (64 tokens, EOS
    ignored) is stopped on the way: both are printed, the first as it ended, the second cut."""
    def unhandled(signum, frame):
        raise AssertionError("SIGTERM reached the test process: generate installed no handler")

    previous = signal.signal(signal.SIGTERM, unhandled)
    stopped_after_the_first_end.append(stop)
    long_prompt = list(range(3, 3 + CONTEXT_TOKENS - 2))
    try:
        status, out, err = run_cli(capsys, *generate(core, "--prompt-ids", json.dumps([[5, 6, 7], long_prompt]),
                                                     "--ignore-eos", "--json"))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert status == code and not stopped_after_the_first_end
    short, long = (json.loads(line) for line in out.splitlines())
    assert (long["prompt_ids"], long["finish_reason"], len(long["token_ids"])) == (long_prompt, "length", 2)
    assert short["prompt_ids"] == [5, 6, 7] and short["finish_reason"] == "cancelled"
    assert 0 < len(short["token_ids"]) < 64 and short["message"] == "interrupted before it finished"
    said = [line for line in err.splitlines() if line.startswith("helios generate:")]  # not the load's progress
    assert said == [f"helios generate: {word}: 1 of 2 prompts finished; the others' outputs are cut where they stopped"]
