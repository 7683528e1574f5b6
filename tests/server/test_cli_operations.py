"""The command line for operators: `helios --version`, a one-line description on every
subcommand, `helios generate PROMPT` on the embedded model, and serve's option checks."""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import subprocess
import sys

import pytest

import helios
from helios.cli import generate_cmd, serve_cmd
from helios.cli.main import build_parser, main
from support.embedded_cache import embedded_copy


def test_version(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out.strip() == f"helios {helios.__version__}"


def _subcommands(parser: argparse.ArgumentParser, prefix: str = ""):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield prefix + name, helps.get(name)
                yield from _subcommands(sub, prefix + name + " ")


def test_every_subcommand_has_a_one_line_description():
    commands = dict(_subcommands(build_parser()))
    assert {"generate", "serve", "prepare", "contract check"} <= set(commands)
    for name, text in commands.items():
        assert text and "\n" not in text and len(text) < 100, name


def test_each_command_is_registered_by_the_module_its_table_names_and_alone_imports_no_other():
    """`helios verify` imported every command module (torch among them: about 5 s before anything
    ran); a command line naming a command now imports its module only."""
    from helios.cli import main as cli_main

    registered = {}
    for module in cli_main.COMMAND_MODULES:
        parser = argparse.ArgumentParser()
        importlib.import_module(module).register(parser.add_subparsers())
        choices = next(a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        registered.update({name: module for name in choices})
    assert registered == cli_main.COMMANDS
    for name, module in cli_main.COMMANDS.items():
        assert set(dict(_subcommands(build_parser([name, "--help"])))) == {
            command for command in dict(_subcommands(build_parser())) if command.split()[0] in
            {other for other, owner in cli_main.COMMANDS.items() if owner == module}}
    probe = ("import sys; from helios.cli.main import build_parser; build_parser(['verify', 'x.core']); "
             "print(sorted(m for m in ('torch', 'helios.cli.serve_cmd', 'helios.cli.prepare_cmd') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", (done.stdout, done.stderr[-2000:])


def test_serve_starts_its_engine_process_before_it_imports_torch_or_the_serving_stack():
    """`helios serve` imported torch, FastAPI and the runtime (about 5 s of CPU) before it started its
    engine process, which then spent seconds on the same imports; now the engine process starts once
    the flags are checked, and the two processes import side by side."""
    probe = ("import os, sys\nfrom helios.cli import serve_cmd\nfrom helios.cli.main import main\n\n"
             "def spawn(**kwargs):\n"
             "    print(sorted(m for m in ('torch', 'fastapi', 'helios.cli.serve_run', 'helios.server.engine_process')"
             " if m in sys.modules), flush=True)\n"
             "    os._exit(0)\n\n"
             "serve_cmd.spawn_engine_process = spawn\nmain(['serve', '--port', '0'])\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", (done.stdout, done.stderr[-2000:])


def test_generate_on_the_embedded_model_needs_only_the_prompt(tmp_path, tmp_path_factory, monkeypatch, capsys):
    # the embedded model's cache as its first use left it (support.embedded_cache: prepared once a run; test_app_embedded
    # checks the preparation into the cache)
    embedded_copy(tmp_path_factory.getbasetemp(), tmp_path, monkeypatch)
    frozen_while_generating = []
    generate_body = generate_cmd._generate
    monkeypatch.setattr(generate_cmd, "_generate", lambda args, runtime: frozen_while_generating.append(
        gc.get_freeze_count()) or generate_body(args, runtime))
    assert main(["generate", "hello there", "--max-tokens", "3", "--json", "--ignore-eos"]) == 0
    assert frozen_while_generating[0] > 0 and gc.get_freeze_count() == 0  # the load's objects, for the run only
    (line,) = capsys.readouterr().out.strip().splitlines()
    result = json.loads(line)
    assert len(result["token_ids"]) == 3 and result["finish_reason"] == "length"
    # the prompt was rendered as a chat user message (the embedded model is a chat model)
    assert result["prompt_ids"][0] == 0  # <|im_start|> in the test tokenizer


def test_generate_names_a_missing_core_file(tmp_path, capsys):
    key = tmp_path / "k.pub"
    assert main(["keygen", "-o", str(tmp_path / "k"), "--namespace", "x/y"]) == 0
    assert main(["generate", str(tmp_path / "missing.core"), "hi", "--accept", "x/y", "--trust", str(key)]) != 0
    assert "missing.core" in capsys.readouterr().err
    assert main(["generate", str(tmp_path / "missing.core"), "hi"]) == 2
    assert "--accept" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["--served-model-name", "a", "a"], "distinct"),
    (["--served-model-name", " "], "nonempty"),
    (["--served-model-name", "bad\udcff"], "printable UTF-8"),  # bytes not UTF-8 (every /metrics scrape: 500)
    (["--served-model-name", "two\nlines"], "printable UTF-8"),
    (["--api-key", ""], "must not be empty"),
    (["--stream-interval", "0"], "--stream-interval must be positive"),
])
def test_serve_checks_its_operator_options(argv, message, capsys):
    assert main(["serve", "--port", "0", *argv]) == 2
    assert message in capsys.readouterr().err


def test_api_key_defaults_to_the_environment(monkeypatch):
    monkeypatch.setenv("HELIOS_API_KEY", "from-env")
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers()
    serve_cmd.register(commands)
    assert parser.parse_args(["serve"]).api_key == "from-env"


def test_generate_trusts_a_key_file_with_a_non_ascii_namespace(tmp_path, capsys):
    """keygen writes a non-ASCII namespace (UTF-8); --trust read the file as ASCII and refused it."""
    key = tmp_path / "k.pub"
    assert main(["keygen", "-o", str(tmp_path / "k"), "--namespace", "acmé/models"]) == 0
    capsys.readouterr()
    assert main(["generate", str(tmp_path / "missing.core"), "hi", "--accept", "acmé/models", "--trust", str(key)]) != 0
    err = capsys.readouterr().err
    assert "missing.core" in err and "not a public key" not in err
