"""Capacity and frontend options of `helios prepare`, startup flags and key options of `generate` and
`serve`, and `--host` literals.

- `prepare --context-tokens 8` failed on the default page size ("page_tokens 16 exceeds
  context_tokens (8)"): the page default now follows a smaller context, as the prefill default does
  (the largest power of two within it), and an explicit `--page-tokens` past the context is refused
  naming both options.
- The capacity errors named `CapacityPlan`'s fields (`prefill_tokens`, `page_tokens`,
  `draft_tokens`, `packed_per_lane`), which no option spells; each now names the option given.
- A `--frontend` key stated twice with two values kept the last without a word; it is refused.
- A startup flag the core cannot honour (`serve --context-tokens 100000`, `--max-active`,
  `--speculative-width`, `--history-drafting`) was refused naming the contract's path
  (`startup.context_tokens`), and by `generate` only from the load; now before it, naming the flag.
- `generate` and `serve` without a core file (the embedded model, prepared unsealed on first use)
  read an `--aes-key` and ignored it; it is refused as `--trust` is.
- `serve --host ::ffff:127.0.0.1` (an IPv4-mapped IPv6 literal) failed to bind ("Invalid argument":
  Linux binds a mapped address only with IPV6_V6ONLY off); it now listens for that IPv4 address.
"""

from __future__ import annotations

import contextlib
import re
import socket

import pytest

from helios.core.keys import SigningKey, write_key_pair
from helios.errors import UsageError
from support.cli_runs import one_line, run_cli as run


@pytest.fixture
def prepare_argv(tmp_path, monkeypatch):
    """`helios prepare` arguments for an empty checkpoint directory and a fresh key; the capture
    (`prepare_core`) records its options and stops, so a command line's checks run in milliseconds."""
    import helios.cli.prepare_cmd as prepare_cmd

    key = tmp_path / "publisher.key"
    write_key_pair(key, SigningKey.generate())
    (tmp_path / "checkpoint").mkdir()
    captured = []

    def captured_prepare(checkpoint, output, key, options, progress):
        captured.append(options)
        raise UsageError("captured")

    monkeypatch.setattr(prepare_cmd, "prepare_core", captured_prepare)
    return ["prepare", tmp_path / "checkpoint", "-o", tmp_path / "m.core", "--key", key, "--namespace", "a/b"], captured


@pytest.mark.parametrize("context, page, prefill", [(8, 8, 8), (10, 8, 10), (1, 1, 1), (16, 16, 16), (300, 16, 256)])
def test_a_small_context_lowers_the_default_page_size_as_it_lowers_the_prefill(prepare_argv, context, page, prefill,
                                                                                 capsys):
    argv, captured = prepare_argv
    code, _, err = run(capsys, *argv, "--context-tokens", context)
    assert code == 2 and one_line(err) == "helios prepare: error: captured\n"  # the capture was reached
    plan = captured[0].capacities
    assert (plan.context_tokens, plan.page_tokens, plan.prefill_tokens) == (context, page, prefill)


@pytest.mark.parametrize("options, message", [
    (["--context-tokens", "8", "--page-tokens", "16"], "--page-tokens 16 exceeds --context-tokens 8"),
    (["--page-tokens", "0"], "--page-tokens must be in 1..4096"),
    (["--page-tokens", "5000", "--context-tokens", "8000"], "--page-tokens must be in 1..4096"),
    (["--context-tokens", "0"], "--context-tokens must be in 1..16777216"),
    (["--context-tokens", "-5"], "--context-tokens must be in 1..16777216"),
    (["--context-tokens", str(10**14)], "--context-tokens must be in 1..16777216"),
    (["--prefill-tokens", "0"], "--prefill-tokens must be in 1..2048 (--context-tokens)"),
    (["--prefill-tokens", "4096"], "--prefill-tokens must be in 1..2048 (--context-tokens)"),
    (["--prefill-chunks", "256"],
     "--prefill-chunks must each be smaller than the prefill tokens (256, --prefill-tokens)"),
    (["--prefill-tokens", "32", "--prefill-chunks", "8,32"], "--prefill-chunks must each be smaller"),
    (["--decode-batches", "1,99999"], "--decode-batches must each be at most 4096, got 99999"),
    (["--context-tokens", "16777216", "--page-tokens", "1", "--decode-batches", "4096"],
     "--context-tokens 16777216 in pages of 1 tokens (--page-tokens) for 4096 requests (--decode-batches)"),
    (["--draft", ".", "--draft-tokens", "0"], "--draft-tokens must be in 1..64"),
    (["--draft", ".", "--draft-tokens", "65"], "--draft-tokens must be in 1..64"),
    (["--draft", ".", "--packed-per-lane", "0"], "--packed-per-lane must be positive"),
    (["--draft", ".", "--speculative-widths", "1,100"], "--speculative-widths must each be at most 64"),
    (["--draft", ".", "--speculative-batches", "99999"], "--speculative-batches must each be at most 4096"),
])
def test_each_capacity_mistake_names_the_option_given(prepare_argv, options, message, capsys):
    """Refused before the checkpoint is read (the capture is never reached), naming the option and
    none of the plan's internal field names."""
    argv, captured = prepare_argv
    code, _, err = run(capsys, *argv, *options)
    assert code == 2 and message in one_line(err) and not captured
    assert not re.search(r"\b[a-z]+_[a-z_]+\b", err.removeprefix("helios prepare: error: ")), err


@pytest.mark.parametrize("option", ["--prefill-chunks", "--decode-batches", "--speculative-widths",
                                    "--patch-capacities"])
def test_a_list_option_with_a_zero_names_what_it_takes(prepare_argv, option, capsys):
    """"batch capacities must be positive" was said of token capacities and widths too."""
    argv, _ = prepare_argv
    code, _, err = run(capsys, *argv, option, "4,0")
    assert code == 2 and f"argument {option}: expected positive integers, got '4,0'" in err
    assert "batch capacities" not in err


def test_a_frontend_fact_stated_twice_with_two_values_is_refused(prepare_argv, capsys):
    """The last value won and the first was dropped without a word; the same value twice is one statement."""
    argv, captured = prepare_argv
    code, _, err = run(capsys, *argv, "--frontend", "family=hermes", "--frontend", "family=none")
    assert code == 2 and not captured
    assert one_line(err) == ("helios prepare: error: --frontend states family twice, as 'hermes' and 'none'; "
                             "state it once\n")
    code, _, err = run(capsys, *argv, "--frontend", "family=none", "--frontend", "family=none")
    assert code == 2 and one_line(err) == "helios prepare: error: captured\n"
    assert captured[0].frontend == (("family", "none"), ("family", "none"))


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_an_aes_key_without_a_core_file_is_refused_as_trust_is(command, tmp_path, monkeypatch, capsys):
    """The embedded model is prepared unsealed: the key was read and silently ignored."""
    import helios.embedded.prepared as embedded

    def no_embedded():
        raise AssertionError("opened the embedded model for a refused command line")

    monkeypatch.setattr(embedded, "embedded_core", no_embedded)
    aes = tmp_path / "aes.key"
    aes.write_text("00" * 32)
    argv = ["generate", "What is 2 + 3?"] if command == "generate" else ["serve", "--port", "0", "--no-engine-process"]
    code, out, err = run(capsys, *argv, "--aes-key", aes)
    assert code == 2 and out == ""
    assert f"helios {command}: error: --aes-key opens a sealed (version 4) core file; no core file is given" in err
    assert "Traceback" not in err


def _listening(host: str):
    from helios.server.serve import bind

    sock = bind(host, 0)
    sock.listen(1)
    return sock


@pytest.mark.parametrize("host", ["::ffff:127.0.0.1", "[::ffff:127.0.0.1]", "::ffff:7f00:1"])
def test_an_ipv4_mapped_host_listens_for_its_ipv4_address(host):
    with contextlib.closing(_listening(host)) as server:
        assert server.family == socket.AF_INET6 and server.getsockname()[0] == "::ffff:127.0.0.1"
        port = server.getsockname()[1]
        with contextlib.closing(socket.create_connection(("127.0.0.1", port), timeout=5)):
            accepted, _ = server.accept()
            accepted.close()
        from helios.server.serve import ListenError, bind

        with pytest.raises(ListenError, match="Address already in use"):  # the port is held for IPv4 too
            bind("127.0.0.1", port)


@pytest.mark.parametrize("host, family, address", [
    ("0.0.0.0", socket.AF_INET, "0.0.0.0"), ("::", socket.AF_INET6, "::"), ("[::1]", socket.AF_INET6, "::1"),
    ("localhost", socket.AF_INET, "127.0.0.1"),
])
def test_other_hosts_bind_as_before_ipv6_ones_for_ipv6_alone(host, family, address):
    with contextlib.closing(_listening(host)) as server:
        assert (server.family, server.getsockname()[0]) == (family, address)
        if family == socket.AF_INET6:
            assert server.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 1


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from support.server_core import tiny_core

    return tiny_core(tmp_path_factory.getbasetemp())


@pytest.mark.parametrize("argv, message", [
    (["generate", "--prompt-ids", "[[5, 6]]", "--speculative-width", "4"],
     "--speculative-width: 4 is not a prepared width"),
    (["generate", "--prompt-ids", "[[5, 6]]", "--history-drafting"], "--history-drafting: history drafting requires"),
    (["serve", "--no-engine-process", "--port", "0", "--context-tokens", "100000"],
     "--context-tokens: 100000 is outside the prepared range [1, 256]"),
    (["serve", "--no-engine-process", "--port", "0", "--max-active", "99999"], "--max-active: 99999 is outside"),
])
def test_a_startup_flag_the_core_cannot_honour_is_named_before_the_load(tiny, argv, message, monkeypatch, capsys):
    """The contract's check named its own path (``startup.context_tokens``, ``startup.max_concurrency``),
    which no flag spells, and `generate` learned it only from the load."""
    import helios.cli.generate_cmd as generate_cmd
    import helios.cli.serve_run as serve_run

    def no_load(*args, **kwargs):
        raise AssertionError("loaded a model for a refused command line")

    monkeypatch.setattr(generate_cmd, "build_runtime", no_load)
    monkeypatch.setattr(serve_run, "build_runtime", no_load)
    code, out, err = run(capsys, argv[0], tiny.path, "--accept", tiny.namespace, "--trust", tiny.public_key, *argv[1:])
    said = [line for line in err.splitlines() if line.startswith(f"helios {argv[0]}: error:")]
    assert code == 2 and out == "" and len(said) == 1 and message in said[0] and "startup." not in err
