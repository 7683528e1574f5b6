"""`helios generate` refuses what the engine would reject, before the model loads: a prompt whose
ids leave the core's vocabulary or that, with --max-tokens, passes the context extent is one line
and exit 2 once the core is opened (it was exit 9, after a load of seconds to minutes). Options
whose bounds need no core (a device name, tensor-parallel timeouts and counts) are refused before
the core is opened. A closed standard output is refused before the load, and with standard error
closed no line of it lands among the output. In process through `main`, on the shared tiny prepared core."""

from __future__ import annotations

import sys

import pytest

from helios.cli.main import main
from support.cli_runs import one_line, run_cli
from support.server_core import CONTEXT_TOKENS, tiny_core


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    return tiny_core(tmp_path_factory.getbasetemp())


@pytest.fixture
def no_load(monkeypatch):
    import helios.cli.generate_cmd as generate_cmd

    def refused(*args, **kwargs):
        raise AssertionError("loaded the model for a command line it should have refused")

    monkeypatch.setattr(generate_cmd, "build_runtime", refused)


def run(capsys, *argv) -> tuple[int, str]:
    code, _, err = run_cli(capsys, *argv)
    return code, one_line(err)


def generate(core, *argv):
    return ["generate", core.path, "--accept", core.namespace, "--trust", core.public_key, *argv]


@pytest.mark.parametrize("argv, message", [
    (["--prompt-ids", "[[5, 6, 7]]", "--max-tokens", str(CONTEXT_TOKENS - 2)],
     f"prompt 1: 3 prompt tokens + --max-tokens {CONTEXT_TOKENS - 2} exceed the context extent of "
     f"{CONTEXT_TOKENS} tokens; ask for at most {CONTEXT_TOKENS - 3} tokens"),
    (["--prompt-ids", f"[[5], {list(range(3, 3 + CONTEXT_TOKENS))}]"], "prompt 2: "),
    (["--prompt-ids", f"[[5], {list(range(3, 3 + CONTEXT_TOKENS))}]"], "shorten the prompt"),
    (["hello", "--max-tokens", str(CONTEXT_TOKENS)], "exceed the context extent"),
    (["--chat", "hello", "--max-tokens", str(CONTEXT_TOKENS - 1)], "exceed the context extent"),
    (["--prompt-ids", "[[5], [-1]]"], "prompt 2: token id -1 is outside the core's vocabulary [0, "),
    (["--prompt-ids", f"[[{10**30}]]"], f"prompt 1: token id {10**30} is outside the core's vocabulary"),
])
def test_prompts_that_cannot_fit_the_core_are_refused_before_the_load(core, no_load, argv, message, capsys):
    code, err = run(capsys, *generate(core, *argv))
    assert code == 2 and message in err and err.startswith("helios generate: error: prompt ")


def test_without_max_tokens_a_long_prompt_gets_what_its_context_leaves(core, no_load, monkeypatch, capsys):
    """The default --max-tokens (64) was refused after a prompt leaving fewer tokens ("ask for at
    most 1 tokens"), where the server's omitted limit is the rest of the context."""
    import helios.cli.generate_cmd as generate_cmd

    limits, real = [], generate_cmd._output_limits
    monkeypatch.setattr(generate_cmd, "_output_limits", lambda *args: limits.append(real(*args)) or limits[-1])
    long_prompt = list(range(3, 3 + CONTEXT_TOKENS - 1))
    with pytest.raises(AssertionError, match="loaded the model"):
        main([str(a) for a in generate(core, "--prompt-ids", f"[[5, 6, 7], {long_prompt}]")])
    assert limits == [[min(generate_cmd.DEFAULT_MAX_TOKENS, CONTEXT_TOKENS - 3), 1]]
    code, err = run(capsys, *generate(core, "--prompt-ids", f"[{long_prompt}]", "--max-tokens", "2"))
    assert code == 2 and err.rstrip().endswith("ask for at most 1 token")


def test_a_prompt_that_fits_exactly_reaches_the_load(core, no_load, capsys):
    """The bound is the engine's: prompt plus output limit up to the context extent, not below it."""
    with pytest.raises(AssertionError, match="loaded the model"):
        main([str(a) for a in generate(core, "--prompt-ids", "[[5, 6, 7]]", "--max-tokens", str(CONTEXT_TOKENS - 3))])


@pytest.mark.parametrize("argv, message", [
    (["--max-tokens", str(10**30)], "--max-tokens must be in 1..2147483647"),
    (["--device", "bogus"], "--device 'bogus' is not a device: give cpu, cuda or cuda:N"),
    (["--device", "meta"], "--device 'meta': models run on the CPU or on CUDA"),
    (["--device", "cuda:-1"], "--device 'cuda:-1' is not a device"),
    (["--join-timeout", "1e30"], "--join-timeout must be at most"),
    (["--collective-timeout", "1e30"], "--collective-timeout must be at most"),
    (["--local-ranks", str(10**30)], "--local-ranks must be in 1.."),
])
def test_generate_refuses_option_values_before_opening_the_core(tmp_path, argv, message, capsys):
    code, err = run(capsys, "generate", tmp_path / "never-opened.core", "--accept", "a/b", "--prompt-ids", "[[1]]",
                    *argv)
    assert code == 2 and message in err


@pytest.mark.parametrize("argv, message", [
    (["--device", "bogus"], "--device 'bogus'"),
    (["--join-timeout", "1e30"], "--join-timeout must be at most"),
])
def test_serve_refuses_a_device_that_is_no_device_and_timeouts_past_a_year(argv, message, capsys):
    code, err = run(capsys, "serve", "no.core", *argv)
    assert code == 2 and message in err


def test_rank_refuses_a_join_timeout_past_a_year(tmp_path, capsys):
    from helios.cli.rank_cmd import run_alone

    code = run_alone([str(tmp_path / "missing.core"), "--join", "127.0.0.1:5000", "--join-timeout", "1e30",
                      "--accept", "ns", "--trust", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--join-timeout must be at most" in err


def test_pages_too_few_for_one_request_are_refused_before_anything_loads(core, monkeypatch, capsys):
    """`--pages 1` was "cache.max_pages_per_request exceeds cache.num_pages" after the programs,
    weights and kernels had loaded; now the count one request of the context extent takes is named
    before any of them."""
    import helios.runtime.loading.model as model

    def refused(*args, **kwargs):
        raise AssertionError("loaded weights for a page count that cannot hold one request")

    monkeypatch.setattr(model, "_load_weights_on_device", refused)
    code, err = run(capsys, *generate(core, "--prompt-ids", "[[5, 6, 7]]", "--pages", "1"))
    assert code == 8 and "1 physical cache pages asked for, but one request of the context extent" in err
    assert f"({CONTEXT_TOKENS} tokens" in err and "ask for at least" in err


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
    from helios.contract import serving_pb2 as spb
    from helios.runtime.offline import Generation
    from helios.runtime.records.events import FinishReason

    tokenizer_json = (core.path.parent / "checkpoint" / "tokenizer.json").read_bytes()
    runtime = SimpleNamespace(engine=None, close=lambda: None,
                              model=SimpleNamespace(tokenizer_json=tokenizer_json,
                                                    prepared=SimpleNamespace(contract=spb.ServingContract()),
                                                    settings=SimpleNamespace(eos_token_ids=())))
    monkeypatch.setattr(generate_cmd, "build_runtime", lambda *args: runtime)
    monkeypatch.setattr(generate_cmd, "_run_batch",
                        lambda *args: ([Generation((), FinishReason.REJECTED, 3, "injected rejection")], None))
    monkeypatch.setattr(sys, "stderr", None)
    code, out, _ = run_cli(capsys, "generate", core.path, "--accept", core.namespace, "--trust", core.public_key,
                           "--prompt-ids", "[[5, 6, 7]]")
    assert code == 9 and out == "\n"


def test_a_closed_standard_error_keeps_the_error_line_out_of_the_output(core, no_load, monkeypatch, capsys):
    """A command's one error line went to standard output when standard error was closed."""
    monkeypatch.setattr(sys, "stderr", None)
    code, out, _ = run_cli(capsys, "generate", core.path, "--accept", core.namespace, "--trust", core.public_key,
                           "--prompt-ids", "[[5, 6, 7]]", "--max-tokens", "0")
    assert code == 2 and out == ""
