"""`helios generate` command-line mistakes found in session 68, each one line and a documented exit
status before the model loads. In process through `main`, on the shared tiny prepared core."""

from __future__ import annotations

import sys

import pytest

from support.cli_runs import one_line, run_cli
from support.server_core import tiny_core


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    return tiny_core(tmp_path_factory.getbasetemp())


@pytest.fixture
def no_load(monkeypatch):
    import helios.cli.generate_cmd as generate_cmd

    def refused(*args, **kwargs):
        raise AssertionError("loaded the model for a command line it should have refused")

    monkeypatch.setattr(generate_cmd, "build_runtime", refused)


def test_a_closed_standard_output_is_refused_before_the_load(core, no_load, monkeypatch, capsys):
    """`helios generate ... >&-` loaded the model, generated, printed into nothing (Python's
    `sys.stdout` is None) and ended with an AttributeError traceback from the flush."""
    monkeypatch.setattr(sys, "stdout", None)
    code, _, err = run_cli(capsys, "generate", core.path, "--accept", core.namespace, "--trust", core.public_key,
                           "--prompt-ids", "[[5, 6, 7]]")
    assert code == 2 and "standard output is closed" in one_line(err)


def test_a_closed_standard_error_keeps_the_load_progress_out_of_the_output(monkeypatch, capsys):
    """With standard error closed (`2>&-`, `sys.stderr` None) `print(file=sys.stderr)` writes to
    standard output: the load's progress lines ("helios: ran the first (checked) call ...") came
    before the generated text in `helios generate ... 2>&- > out.txt`."""
    import argparse

    from helios.cli.runtime_flags import add_runtime_flags, runtime_flags
    from helios.contract import StartupOptions

    parser = argparse.ArgumentParser()
    add_runtime_flags(parser)
    load, _, _ = runtime_flags(parser.parse_args([]), StartupOptions(), "cpu")
    monkeypatch.setattr(sys, "stderr", None)
    load.progress("ran the first (checked) call of decode R=1 T=1 in 0.1 s [1/1]")
    assert capsys.readouterr().out == ""


def test_a_closed_standard_error_keeps_failed_prompts_out_of_the_output(core, monkeypatch, capsys):
    """A prompt the engine rejects is reported on standard error and exits 9; with standard error
    closed that line was printed into the generated output instead."""
    from types import SimpleNamespace

    import helios.cli.generate_cmd as generate_cmd
    from helios.runtime.offline import Generation
    from helios.runtime.records.events import FinishReason

    tokenizer_json = (core.path.parent / "checkpoint" / "tokenizer.json").read_bytes()
    runtime = SimpleNamespace(engine=None, close=lambda: None,
                              model=SimpleNamespace(tokenizer_json=tokenizer_json,
                                                    settings=SimpleNamespace(eos_token_ids=())))
    monkeypatch.setattr(generate_cmd, "build_runtime", lambda *args: runtime)
    monkeypatch.setattr(generate_cmd, "generate",
                        lambda *args: [Generation((), FinishReason.REJECTED, 3, "injected rejection")])
    monkeypatch.setattr(sys, "stderr", None)
    code, out, _ = run_cli(capsys, "generate", core.path, "--accept", core.namespace, "--trust", core.public_key,
                           "--prompt-ids", "[[5, 6, 7]]")
    assert code == 9 and out == "\n"
