"""Operator mistakes and hostile inputs at the `helios` command line: every one is a single line on
stderr naming the problem and a documented exit status (2 for a usage mistake), never a traceback,
a wait on a FIFO, an unbounded read or a replaced input file. In process through `main`; the
commands that load a model are stopped by their checks before any load."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.builders import NAMESPACE, build_core, random_bytes
from helios.core.records import CoreFormat
from helios.cli.main import build_parser, main
from helios.core.keys import SigningKey, load_signing_key, write_key_pair
from support.cli_runs import disk_full_past, one_line, run_cli as run


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """A signed single-file core, its publisher's key pair, another key pair, and hostile paths."""
    root = tmp_path_factory.mktemp("cli-inputs")
    write_key_pair(root / "pub.key", SigningKey.generate())
    write_key_pair(root / "other.key", SigningKey.generate())
    core = root / "m.core"
    build_core(core, [load_signing_key(root / "pub.key")], extra={"blob": random_bytes(3000)})
    os.mkfifo(root / "fifo")  # nobody ever writes to it: opening it for reading would wait
    (root / "empty").write_bytes(b"")
    (root / "dir").mkdir()
    return {"root": root, "core": core, "key": root / "pub.key", "pub": root / "pub.key.pub",
            "other": root / "other.key", "fifo": root / "fifo", "empty": root / "empty", "dir": root / "dir"}


def trusted(files) -> list:
    return ["--accept", NAMESPACE, "--trust", files["pub"]]


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


# -- help and usage ----------------------------------------------------------------------------------


def _commands(parser: argparse.ArgumentParser, prefix=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name), sub
                yield from _commands(sub, (*prefix, name))


COMMANDS = [names for names, _ in _commands(build_parser())]


def test_every_command_says_what_it_does_and_every_option_has_help_and_a_metavar():
    missing = []
    for names, parser in _commands(build_parser()):
        if names[0] == "rank":  # `helios rank`'s own tests hold it to its options (tests/parallel)
            continue
        if not parser.description:
            missing.append(f"{' '.join(names)}: no description")
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            label = f"{' '.join(names)} {'/'.join(action.option_strings) or action.dest}"
            if not action.help:
                missing.append(f"{label}: no help")
            takes_value = action.nargs != 0 and not isinstance(action, argparse.BooleanOptionalAction)
            if action.option_strings and takes_value and action.metavar is None and action.choices is None:
                missing.append(f"{label}: no metavar")
            # by identity: a default of 0 (== False) is stated too (--host-pages' was not)
            stated = not any(action.default is unstated for unstated in (None, False, True, argparse.SUPPRESS)) \
                and action.default not in ([], ())
            if stated and "default" not in (action.help or ""):
                missing.append(f"{label}: default {action.default!r} not stated")
    assert not missing, missing


@pytest.mark.parametrize("names", COMMANDS, ids=" ".join)
def test_help_of_every_command(names, capsys):
    code, out, err = run(capsys, *names, "--help")
    assert code == 0 and err == ""
    assert out.startswith(f"usage: helios {' '.join(names)}")


def test_no_arguments_prints_usage_and_exits_2(capsys):
    code, out, err = run(capsys)
    assert code == 2 and out == ""
    assert err.startswith("usage: helios") and "required: COMMAND" in err


@pytest.mark.parametrize("argv, unknown, usage", [
    (["verify", "x.core", "--bogus", "--accept", "a"], "--bogus", "usage: helios verify"),
    (["contract", "check", "f.json", "--bogus"], "--bogus", "usage: helios contract check"),
    (["serve", "a.core", "extra"], "extra", "usage: helios serve"),
])
def test_an_unknown_option_shows_its_command_usage(argv, unknown, usage, capsys):
    code, _, err = run(capsys, *argv)
    lines = err.splitlines()
    assert code == 2 and lines[0].startswith(usage) and lines[-1].endswith(f"unrecognized arguments: {unknown}")


@pytest.mark.parametrize("argv", [["bogus"], ["verify", "x.core", "--bogus", "--accept", "a"],
                                  ["contract", "bogus"], ["generate", "--max-tokens", "nan"],
                                  ["serve", "--port", "1e30"], ["relocate", "x", "-o", "y", "--split-bytes", "inf"]])
def test_unknown_commands_options_and_non_numbers_are_usage_errors(argv, capsys):
    code, _, err = run(capsys, *argv)
    assert code == 2
    lines = err.splitlines()
    assert lines[0].startswith("usage: helios") and sum(line.startswith("helios") for line in lines) == 1


# -- key files ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("flag, message", [("--key", "is empty"), ("--aes-key", "64 hexadecimal digits")])
def test_a_key_file_that_is_a_fifo_nobody_writes_to_is_read_as_empty(files, flag, message, capsys):
    output = files["root"] / "fifo-signed.core"
    signer = [] if flag == "--key" else ["--key", files["other"]]
    code, _, err = run(capsys, "sign", files["core"], *signer, flag, files["fifo"], "-o", output)
    assert code == 2 and message in one_line(err) and f"{flag} {files['fifo']}" in err
    assert not output.exists()


def test_trusting_a_fifo_does_not_wait(files, capsys):
    code, _, err = run(capsys, "verify", files["core"], "--accept", NAMESPACE, "--trust", files["fifo"])
    assert code == 2 and str(files["fifo"]) in one_line(err)


def test_a_fifo_among_a_trusted_directory_does_not_wait(tmp_path, files, capsys):
    (tmp_path / "a.pub").write_bytes(files["pub"].read_bytes())
    os.mkfifo(tmp_path / "b.pub")
    code, _, err = run(capsys, "verify", files["core"], "--accept", NAMESPACE, "--trust", tmp_path)
    assert code == 2 and "b.pub" in one_line(err)


@pytest.mark.parametrize("flag", ["--key", "--aes-key", "--trust"])
def test_a_device_or_a_core_given_as_a_key_is_not_read_whole(files, flag, capsys):
    """/dev/zero never ends; a core given by mistake may be gigabytes: reading stops past 64 KiB."""
    big = files["root"] / "big.core"
    if not big.exists():
        with open(big, "wb") as out:
            out.truncate(1 << 30)  # sparse: a gigabyte that takes no disk
    for path in ("/dev/zero", big):
        if flag == "--trust":
            argv = ["verify", files["core"], "--accept", NAMESPACE, "--trust", path]
        else:
            argv = ["sign", files["core"], "--key", files["other"], flag, path, "-o", files["root"] / "n.core"]
        code, _, err = run(capsys, *argv)
        assert code == 2 and "larger than any key file" in one_line(err) and str(path) in err


def test_a_public_key_where_the_private_key_goes_and_the_reverse(files, capsys):
    code, _, err = run(capsys, "sign", files["core"], "--key", files["pub"])
    assert code == 2 and "is a public key" in one_line(err) and str(files["pub"]) in err
    code, _, err = run(capsys, "verify", files["core"], "--accept", NAMESPACE, "--trust", files["key"])
    assert code == 2 and "is a private key" in one_line(err) and str(files["key"]) in err


@pytest.mark.parametrize("content", [b"", b"-----BEGIN PRIVATE KEY-----\njunk\n-----END PRIVATE KEY-----\n",
                                     b"\xff\xfe binary"])
def test_a_private_key_file_that_is_empty_or_junk(files, tmp_path, content, capsys):
    (tmp_path / "bad.key").write_bytes(content)
    code, _, err = run(capsys, "sign", files["core"], "--key", tmp_path / "bad.key")
    assert code == 2 and f"--key {tmp_path / 'bad.key'}" in one_line(err)


@pytest.mark.parametrize("content", [b"", b"00" * 16, b"zz" * 32])
def test_an_aes_key_file_of_the_wrong_length_or_form_is_named(files, tmp_path, content, capsys):
    (tmp_path / "aes").write_bytes(content)
    code, _, err = run(capsys, "verify", files["core"], *trusted(files), "--aes-key", tmp_path / "aes")
    assert code == 2 and f"--aes-key {tmp_path / 'aes'}" in one_line(err) and "64 hexadecimal digits" in err


def test_key_file_mistakes_are_usage_errors_in_every_command_that_reads_keys(files, tmp_path, capsys):
    """A key file is the operator's input: exit 2 (usage), not 4 (a core that cannot be read), in
    every command that takes one, before any core is opened or model loaded."""
    (tmp_path / "junk.pub").write_text("not a key\n")
    (tmp_path / "no-keys").mkdir()
    (tmp_path / "checkpoint").mkdir()
    absent = files["root"] / "never-opened.core"
    for argv, message in [
        (["sign", files["core"], "--key", tmp_path / "junk.pub"], "--key"),
        (["verify", files["core"], "--accept", NAMESPACE, "--trust", tmp_path / "junk.pub"], "junk.pub"),
        (["verify", files["core"], "--accept", NAMESPACE, "--trust", tmp_path / "no-keys"], "holds no *.pub"),
        (["verify", files["core"], "--accept", NAMESPACE, "--trust", tmp_path / "absent.pub"], "cannot read"),
        (["generate", files["core"], "--accept", NAMESPACE, "--trust", files["key"], "--prompt-ids", "[[1]]"],
         "is a private key"),
        (["generate", absent, "--accept", NAMESPACE, "--trust", files["pub"], "--aes-key", files["pub"],
          "--prompt-ids", "[[1]]"], "64 hexadecimal digits"),
        (["serve", files["core"], "--accept", NAMESPACE, "--trust", tmp_path / "junk.pub", "--port", "0"],
         "junk.pub"),
        (["prepare", tmp_path / "checkpoint", "-o", tmp_path / "p.core", "--key", files["pub"], "--namespace", "a/b"],
         "is a public key"),
        (["contract", "example-core", EXAMPLE, "-o", tmp_path / "e.core", "--key", files["pub"],
          "--namespace", "a/b"], "is a public key"),
        (["keygen", "-o", files["key"]], "refusing to overwrite"),
    ]:
        code, _, err = run(capsys, *argv)
        assert (code, message in one_line(err)) == (2, True), (argv, err)


def test_keygen_refuses_an_invalid_namespace_and_a_missing_directory(files, capsys):
    for namespace in ("two words", ""):
        code, _, err = run(capsys, "keygen", "-o", files["root"] / "ns.key", "--namespace", namespace)
        assert code == 2 and "--namespace" in one_line(err)
    assert not (files["root"] / "ns.key").exists()
    code, _, err = run(capsys, "keygen", "-o", files["root"] / "absent" / "k.key")
    assert code == 2 and "does not exist" in one_line(err)


# -- core files and outputs -------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["verify", "inspect", "sign", "relocate"])
@pytest.mark.parametrize("source", ["fifo", "/dev/zero"])
def test_a_core_that_is_not_a_regular_file(files, command, source, capsys):
    path = files.get(source, source)
    extra = {"verify": trusted(files), "inspect": [], "sign": ["--key", files["other"]],
             "relocate": ["-o", files["root"] / "from-fifo.core"]}[command]
    code, _, err = run(capsys, command, path, *extra)
    assert code == 2 and f"{path} is not a regular file" in one_line(err)


@pytest.mark.parametrize("command", ["verify", "inspect", "sign", "relocate"])
@pytest.mark.parametrize("source", ["missing", "dir", "empty", "truncated"])
def test_a_core_that_is_missing_a_directory_empty_or_truncated(files, command, source, capsys):
    truncated = files["root"] / "truncated.core"
    truncated.write_bytes(files["core"].read_bytes()[:600])
    path = {"missing": files["root"] / "absent.core", "truncated": truncated}.get(source) or files[source]
    extra = {"verify": trusted(files), "inspect": [], "sign": ["--key", files["other"]],
             "relocate": ["-o", files["root"] / "from-bad.core"]}[command]
    code, _, err = run(capsys, command, path, *extra)
    assert code == 4 and one_line(err).startswith(f"helios {command}: error: ")
    assert not (files["root"] / "from-bad.core").exists()


def test_a_core_signed_by_an_untrusted_key_or_for_another_namespace(files, capsys):
    code, _, err = run(capsys, "verify", files["core"], "--accept", NAMESPACE,
                       "--trust", files["other"].with_name("other.key.pub"))
    assert code == 6 and one_line(err)
    code, _, err = run(capsys, "verify", files["core"], "--accept", "someone/else", "--trust", files["pub"])
    assert code == 7 and "someone/else" in one_line(err)


def test_a_part_file_name_with_terminal_controls_is_escaped_in_the_error(files, tmp_path, capsys):
    """The location set naming a core's part files is unsigned: a name carrying an escape sequence
    and a newline reached the terminal as they were, and forged a second line ("verified")."""
    from core.builders import read_body, write_body

    split = tmp_path / "split.core"
    assert run(capsys, "relocate", files["core"], "-o", split, "--split-bytes", "1000")[0] == 0
    evil = "p\x1b[31mred\x1b[0m\nhelios verify: verified\u202e"
    _, body = read_body(split)
    for loc in body.locations.locations:
        if loc.file == "split.core.part001":
            loc.file = evil
    write_body(split, body)
    (tmp_path / "split.core.part001").rename(tmp_path / evil)
    with open(tmp_path / evil, "ab") as part:
        part.write(b"x")  # so that its stored ranges do not tile it: an error that names it
    for argv in (["verify", split, *trusted(files)], ["relocate", split, "-o", tmp_path / "out.core"],
                 ["sign", split, "--key", files["other"], "-o", tmp_path / "out.core"]):
        code, _, err = run(capsys, *argv)
        assert code == 5 and "\\x1b[31mred\\x1b[0m\\nhelios verify: verified\\u202e" in one_line(err), err
        assert not any(ch in err for ch in "\x1b\u202e")


def test_inspect_refuses_more_signatures_than_any_reader_accepts(files, tmp_path, capsys):
    """Each signature costs inspect an Ed25519 verification: 100,000 copies of one (12 MB) took 14 s,
    and a 256 MiB body holds 2 million. Every other reader refuses more than 16 (exit 6); so does
    inspect, before verifying any."""
    from core.builders import read_body, write_body

    core = tmp_path / "many.core"
    core.write_bytes(files["core"].read_bytes())
    _, body = read_body(core)
    for _ in range(16):
        body.envelope.signatures.add().CopyFrom(body.envelope.signatures[0])
    write_body(core, body)
    for command in (["inspect", core], ["inspect", "--json", core], ["verify", core, *trusted(files)]):
        code, out, err = run(capsys, *command)
        assert code == 6 and "more than 16 signatures" in one_line(err) and out == ""


def test_sign_refuses_more_signatures_than_a_reader_accepts_and_a_key_given_twice(files, tmp_path, capsys):
    """Signing past 16 signatures wrote a core (in place too) that verify, inspect and serve then
    refused ("more than 16 signatures"); a key given twice was "already signed" (exit 6)."""
    keys = []
    for number in range(16):
        write_key_pair(tmp_path / f"k{number}.key", SigningKey.generate())
        keys += ["--key", tmp_path / f"k{number}.key"]
    core = tmp_path / "m.core"
    core.write_bytes(files["core"].read_bytes())
    before = core.read_bytes()
    code, _, err = run(capsys, "sign", core, *keys)
    assert code == 2 and "at most 16 signatures; it has 1 and --key adds 16" in one_line(err)
    code, _, err = run(capsys, "sign", core, "--key", files["other"], "--key", files["other"])
    assert code == 2 and "the same key more than once" in one_line(err)
    assert core.read_bytes() == before and leftovers(tmp_path) == []
    assert run(capsys, "sign", core, *keys, "--replace")[0] == 0  # 16 in all: the most a reader accepts
    assert run(capsys, "inspect", core)[0] == 0


def test_sign_never_writes_over_its_key(files, tmp_path, capsys):
    key = tmp_path / "cosigner.key"
    write_key_pair(key, SigningKey.generate())
    before = key.read_bytes()
    code, _, err = run(capsys, "sign", files["core"], "--key", key, "-o", key)
    assert code == 2 and "is the --key file" in one_line(err)
    assert key.read_bytes() == before and leftovers(tmp_path) == []


@pytest.mark.parametrize("command", ["sign", "relocate"])
def test_an_output_in_a_missing_directory_or_a_directory(files, command, capsys):
    signer = ["--key", files["other"]] if command == "sign" else []
    for output, problem in ((files["root"] / "absent" / "x.core", "does not exist"), (files["dir"], "is a directory")):
        code, _, err = run(capsys, command, files["core"], *signer, "-o", output)
        assert code == 2 and problem in one_line(err)
    assert leftovers(files["root"]) == [] and list(files["dir"].iterdir()) == []


def test_relocate_never_writes_over_a_part_of_the_core_it_reads(files, tmp_path, capsys):
    split = tmp_path / "split.core"
    assert run(capsys, "relocate", files["core"], "-o", split, "--split-bytes", "1000")[0] == 0
    part = tmp_path / "split.core.part001"
    before = part.read_bytes()
    for command, extra in (("relocate", []), ("sign", ["--key", files["other"]])):
        code, _, err = run(capsys, command, split, *extra, "-o", part)
        assert code == 2 and "part file of the core" in one_line(err)
        assert part.read_bytes() == before
    assert run(capsys, "verify", split, *trusted(files))[0] == 0
    assert run(capsys, "relocate", split, "-o", split)[0] == 0  # onto itself stays allowed
    assert run(capsys, "verify", split, *trusted(files))[0] == 0


def test_a_write_that_runs_out_of_room_leaves_no_output(files, tmp_path, capsys):
    """RLIMIT_FSIZE stands in for a full disk: the write fails with EFBIG past a few bytes."""
    output = tmp_path / "full.core"
    output.write_bytes(b"the operator's previous file")
    with disk_full_past(1024):
        code = main(["relocate", str(files["core"]), "-o", str(output)])
    err = capsys.readouterr().err
    assert code == 1 and one_line(err) == f"helios relocate: error: File too large: {output}\n"
    assert output.read_bytes() == b"the operator's previous file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full.core"]


# -- contracts -------------------------------------------------------------------------------------------

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "contract-tiny.json"


@pytest.mark.parametrize("source", ["fifo", "/dev/zero", "huge"])
def test_a_contract_that_is_a_fifo_a_device_or_huge_is_one_line(files, source, capsys):
    path = {"fifo": files["fifo"], "/dev/zero": Path("/dev/zero"), "huge": files["root"] / "huge.json"}[source]
    if source == "huge" and not path.exists():
        with open(path, "wb") as out:
            out.write(b"{")
            out.truncate(1 << 30)  # sparse
    code, _, err = run(capsys, "contract", "check", path)
    assert str(path) in one_line(err) or source == "fifo"
    assert code == (3 if source == "fifo" else 2)  # an empty FIFO is an empty contract: a contract error


def test_contract_encode_never_writes_over_its_input(tmp_path, capsys):
    contract = tmp_path / "c.json"
    contract.write_bytes(EXAMPLE.read_bytes())
    code, _, err = run(capsys, "contract", "encode", contract, contract)
    assert code == 2 and "is the contract FILE" in one_line(err)
    assert contract.read_bytes() == EXAMPLE.read_bytes()


@pytest.mark.parametrize("argv, message", [
    (["-o", "{key}"], "is the --key file"),
    (["-o", "{dir}/absent/x.core"], "does not exist"),
    (["--namespace", "two words"], "--namespace"),
    (["--seed", str(2**64)], "--seed"),
    (["--seed", "-1"], "--seed"),
    (["--key", "{fifo}"], "empty"),
])
def test_example_core_refuses_mistakes_before_any_work(files, argv, message, capsys):
    before = files["key"].read_bytes()
    options = {"-o": str(files["root"] / "ex.core"), "--key": str(files["key"]), "--namespace": "acme/x"}
    for flag, value in zip(argv[::2], argv[1::2]):
        options[flag] = value.format(key=files["key"], dir=files["root"], fifo=files["fifo"])
    code, _, err = run(capsys, "contract", "example-core", EXAMPLE, *[x for kv in options.items() for x in kv])
    assert code == 2 and message in one_line(err)
    assert files["key"].read_bytes() == before and not (files["root"] / "ex.core").exists()


def test_prepare_never_writes_over_its_key(files, tmp_path, capsys):
    key = tmp_path / "publisher.key"
    write_key_pair(key, SigningKey.generate())
    before = key.read_bytes()
    (tmp_path / "checkpoint").mkdir()
    code, _, err = run(capsys, "prepare", tmp_path / "checkpoint", "-o", key, "--key", key, "--namespace", "a/b")
    assert code == 2 and "is the --key file" in one_line(err)
    assert key.read_bytes() == before



@pytest.mark.parametrize("option", [["--speculative-widths", "1,8"], ["--draft-tokens", "0"],
                                    ["--packed-per-lane", "0"], ["--speculative-batches", "2"]])
def test_prepare_refuses_a_speculative_option_without_a_draft(files, tmp_path, option, capsys):
    """`--speculative-widths` (it had a default) and a zero `--draft-tokens` or `--packed-per-lane`
    (read as absent) without `--draft` were dropped: the core was prepared without speculation."""
    (tmp_path / "checkpoint").mkdir()
    code, _, err = run(capsys, "prepare", tmp_path / "checkpoint", "-o", tmp_path / "m.core", "--key", files["key"],
                       "--namespace", "a/b", *option)
    assert code == 2 and "speculative options need --draft" in one_line(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]

# -- generate and serve: checked before any load ------------------------------------------------------


@pytest.mark.parametrize("argv, message", [
    (["--seed", str(2**63)], "--seed"),
    (["--seed", str(-(2**63) - 1)], "--seed"),
    (["--prompt-ids", "[[true]]"], "--prompt-ids"),
    (["--prompt-ids", "[]"], "--prompt-ids"),
    (["--prompt-ids", "[" * 100_000 + "]" * 100_000], "nested too deeply"),
    (["--host-pages", str(10**30), "--preemption", "offload"], "--host-pages must be at most"),
    (["--compile-workers", str(10**30)], "--compile-workers must be at most"),
    (["--image-cache-images", str(10**30)], "--image-cache-images must be at most"),
    (["--temperature", "nan"], "--temperature"),
    (["--temperature", "-1"], "--temperature"),
    (["--max-tokens", "0"], "--max-tokens"),
    (["--max-tokens", "-5"], "--max-tokens"),
])
def test_generate_refuses_option_values_before_loading(files, argv, message, capsys):
    code, _, err = run(capsys, "generate", files["root"] / "never-opened.core", "--accept", NAMESPACE, *argv)
    assert code == 2 and message in one_line(err)


def test_generate_from_a_sealed_core_without_its_aes_key_says_so(files, tmp_path, capsys):
    """The tokenizer's read failing for want of --aes-key was reported as a tokenizer that "does not
    parse" (a load error, exit 8), without the hint to give the key; a core error is exit 4."""
    core = tmp_path / "sealed.core"
    build_core(core, [load_signing_key(files["key"])], core_format=CoreFormat.LOGICAL_V4,
               extra={"tokenizer.json": b"{}"})  # extras are TOKENIZER resources
    code, _, err = run(capsys, "generate", core, *trusted(files), "hello")
    assert code == 4 and "does not parse" not in one_line(err)
    assert "needs the operator's AES key" in err and "give it with --aes-key FILE" in err


@pytest.mark.parametrize("option", ["--send-timeout", "--header-timeout", "--body-timeout"])
def test_serve_refuses_timeouts_past_a_year(option, capsys):
    code, _, err = run(capsys, "serve", "no.core", option, "1e30")
    assert code == 2 and f"{option} must be at most" in one_line(err)


@pytest.mark.parametrize("option", ["--queue-capacity", "--max-body-bytes", "--max-connections", "--max-images",
                                    "--max-image-bytes", "--max-image-pixels", "--stream-interval",
                                    "--max-header-bytes", "--host-pages"])
def test_serve_refuses_counts_past_int32(option, capsys):
    code, _, err = run(capsys, "serve", "no.core", option, str(10**30))
    assert code == 2 and f"{option} must be at most" in one_line(err)


@pytest.mark.parametrize("argv, message", [
    (["--host", ""], "--host must not be empty"),
    (["--host", "  "], "--host must not be empty"),
    (["--api-key", "secret\n"], "--api-key"),
])
def test_serve_refuses_an_empty_host_and_an_unsendable_api_key(argv, message, capsys):
    """An empty --host (an unset variable, say) would listen on every interface."""
    code, _, err = run(capsys, "serve", "no.core", *argv)
    assert code == 2 and message in one_line(err)


def test_serve_names_the_core_that_served_model_name_swallowed(files, tmp_path, capsys, monkeypatch):
    renamed = tmp_path / "model"
    renamed.write_bytes(files["core"].read_bytes()[:64])
    for core in (files["core"], renamed, "absent.core"):
        code, _, err = run(capsys, "serve", "--served-model-name", "a", core)
        assert code == 2 and "put MODEL.core before the option" in one_line(err)
    import helios.cli.serve_run as serve_run

    monkeypatch.setattr(serve_run, "_start", lambda *a: pytest.fail("names that are not cores were refused"))
    monkeypatch.setattr(serve_run, "bind", lambda *a: pytest.fail("names that are not cores were refused"))
    (tmp_path / "notes").write_text("a file that is not a core")
    os.mkfifo(tmp_path / "fifo-name")  # not opened: that would wait for a writer
    monkeypatch.chdir(tmp_path)
    with pytest.raises(pytest.fail.Exception):
        main(["serve", "--served-model-name", "notes", "fifo-name"])


def test_output_the_locale_cannot_encode_is_escaped(tmp_path, monkeypatch, capsys):
    """Under an ASCII locale (or PYTHONIOENCODING=ascii) a non-ASCII path in keygen's output, or
    generated text, raised UnicodeEncodeError (a traceback, exit 1) after the work was done."""
    import io

    out = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["keygen", "-o", str(tmp_path / "ключ.key")]) == 0
    out.flush()
    assert "\\u043a\\u043b\\u044e\\u0447.key (private" in out.buffer.getvalue().decode("ascii")
    assert (tmp_path / "ключ.key.pub").is_file() and "Traceback" not in capsys.readouterr().err


def test_output_into_a_closed_pipe_ends_quietly_with_141(files):
    """`helios inspect CORE | true`: the reader is gone before the first write. One real process
    (its stdout a pipe whose read end is closed at once), for every command, not only generate."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([sys.executable, "-m", "helios.cli.main", "inspect", str(files["core"])],
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=240)
    finally:
        os.close(write)
    assert done.returncode == 141 and done.stderr == ""


@pytest.mark.parametrize("argv", [[], ["--max-tokens", "4"], ["a.core"], ["hello", "--prompt-ids", "[[1]]"]])
def test_generate_without_prompts_or_with_both_kinds_loads_nothing(argv, capsys, monkeypatch):
    """Said before the embedded model is prepared or a core loaded (which takes seconds to minutes)."""
    import helios.cli.generate_cmd as generate_cmd

    def no_load(*args, **kwargs):
        raise AssertionError("loaded a model for a command line that names no prompt")

    monkeypatch.setattr(generate_cmd, "build_runtime", no_load)
    monkeypatch.setattr(generate_cmd, "_open", no_load)
    code, _, err = run(capsys, "generate", *argv)
    assert code == 2 and "give prompt texts or --prompt-ids" in one_line(err)


def test_prompts_after_options_and_a_double_dash_may_start_with_a_dash(files, capsys, monkeypatch):
    """`helios generate M.core --accept NS -- -5`: the `--` that ends the options was refused with the
    prompts as "unrecognized arguments", so a prompt starting with "-" could not follow the options."""
    import helios.cli.generate_cmd as generate_cmd

    seen = []

    def opened(args):
        seen.append(args.prompts)
        raise generate_cmd.UsageError("stop before opening the core")

    monkeypatch.setattr(generate_cmd, "_open", opened)
    head = ["generate", files["core"], "--accept", NAMESPACE]
    for tail, prompts in ((["--", "-5 apples"], ["-5 apples"]), (["hi", "--", "--json", "--"], ["hi", "--json", "--"])):
        code, _, err = run(capsys, *head, *tail)
        assert code == 2 and "stop before opening" in one_line(err) and seen.pop() == prompts
    code, _, err = run(capsys, *head, "hi", "--json2")  # an unknown option before any `--` stays an error
    assert code == 2 and err.splitlines()[-1].endswith("unrecognized arguments: hi --json2") and not seen


def test_a_lone_dash_after_the_options_is_the_same_prompt_as_before_them(files, capsys, monkeypatch):
    """`helios generate M.core --accept NS -` failed with "unrecognized arguments: -", while
    `helios generate M.core - --accept NS` took "-" as a prompt (argparse's positional): wherever
    it stands, a lone "-" is now that one prompt (standard input's text)."""
    import io

    import helios.cli.generate_cmd as generate_cmd

    seen = []

    def opened(args):
        seen.append(args.prompts)
        raise generate_cmd.UsageError("stop before opening the core")

    monkeypatch.setattr(generate_cmd, "_open", opened)
    for argv in (["generate", files["core"], "-", "--accept", NAMESPACE],
                 ["generate", files["core"], "--accept", NAMESPACE, "-"]):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"from stdin\n")))
        code, _, err = run(capsys, *argv)
        assert code == 2 and "stop before opening" in one_line(err) and seen.pop() == ["from stdin"]


def test_keys_of_the_wrong_type_or_length(files, tmp_path, capsys):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    (tmp_path / "ec.key").write_bytes(pem)
    code, _, err = run(capsys, "sign", files["core"], "--key", tmp_path / "ec.key")
    assert code == 2 and "not an Ed25519 key" in one_line(err)
    (tmp_path / "short.pub").write_text("helios-ed25519 AAAA\n")
    code, _, err = run(capsys, "verify", files["core"], "--accept", NAMESPACE, "--trust", tmp_path / "short.pub")
    assert code == 2 and "32 base64-encoded bytes" in one_line(err) and "short.pub" in err


@pytest.mark.parametrize("source", ["file", "stdin"])
def test_a_core_given_to_the_contract_commands_is_named_as_a_core(files, source, monkeypatch, capsys):
    """`helios contract check M.core` read the core as a binary bundle: "Wire format was corrupt"."""
    import io

    path, where = (files["core"], f"{files['core']} is") if source == "file" else ("-", "standard input holds")
    for command in (["check"], ["show"], ["show", "--settings"]):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(files["core"].read_bytes())))
        code, out, err = run(capsys, "contract", *command, path)
        assert code == 2 and out == "" and one_line(err) == (
            f"helios contract: error: {where} a core, not a contract file; `helios inspect CORE` shows the "
            "contract a core holds\n")


def test_verify_exits_3_for_a_signed_core_whose_manifest_names_a_missing_resource_as_its_help_says(
        files, tmp_path, capsys):
    """The exit status was 3 (a contract error) while `helios verify --help` listed 2 and 4 to 7 only."""
    from core.builders import craft_core, required_resources

    core = craft_core(tmp_path / "dangling.core", [load_signing_key(files["key"])], {},
                      omit={required_resources()[0][0]})
    code, _, err = run(capsys, "verify", core, *trusted(files))
    assert code == 3 and "is not in the core" in one_line(err)
    with pytest.raises(SystemExit):
        main(["verify", "--help"])
    usage = " ".join(capsys.readouterr().out.split())
    assert "(2 usage, 3 a contract or manifest that breaks a rule" in usage


def test_generate_refuses_a_checkpoint_directory_given_for_the_core(tmp_path, capsys, monkeypatch):
    """`helios generate ./checkpoint "Hello"` took the directory for a prompt and answered both with
    the embedded model, saying nothing of the checkpoint."""
    import helios.cli.generate_cmd as generate_cmd

    def no_load(*args, **kwargs):
        raise AssertionError("loaded a model for a checkpoint directory")

    monkeypatch.setattr(generate_cmd, "_open", no_load)
    (tmp_path / "config.json").write_text("{}")
    code, out, err = run(capsys, "generate", tmp_path, "Hello")
    assert code == 2 and out == "" and one_line(err) == (
        f"helios generate: error: {tmp_path} is a checkpoint directory; generate takes a prepared core: "
        f"`helios prepare {tmp_path} -o MODEL.core ...` makes one\n")


def test_contract_encode_to_a_dash_writes_standard_output(tmp_path, monkeypatch, capsysbinary):
    """FILE "-" reads standard input, but OUT "-" wrote a file named "-" in the working directory."""
    from helios.contract import PreparedContract

    monkeypatch.chdir(tmp_path)
    assert main(["contract", "encode", str(EXAMPLE), "-"]) == 0
    out, err = capsysbinary.readouterr()
    assert out == PreparedContract.from_json(EXAMPLE.read_text()).to_bundle() and err == b"wrote standard output\n"
    assert list(tmp_path.iterdir()) == []


def test_rank_exits_3_for_a_core_whose_manifest_names_a_missing_resource_as_its_help_says(files, tmp_path, capsys):
    """`helios rank` documented 4 to 7 for a core it cannot open (its --help no exit status at all),
    and exited 3 for this one. A process: the rank ends itself with `os._exit`."""
    from core.builders import craft_core, required_resources

    core = craft_core(tmp_path / "dangling.core", [load_signing_key(files["key"])], {},
                      omit={required_resources()[0][0]})
    done = subprocess.run([sys.executable, "-m", "helios.cli.rank_cmd", str(core), "--join", "127.0.0.1:9",
                           "--join-timeout", "1", *map(str, trusted(files))],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 3 and "is not in the core" in one_line(done.stderr)
    with pytest.raises(SystemExit):
        main(["rank", "--help"])
    usage = " ".join(capsys.readouterr().out.split())
    assert "3 to 7 the core cannot be opened or verified" in usage and "8 the rank could not join" in usage


@pytest.mark.parametrize("where", ["before", "after"])
def test_generate_refuses_trust_without_a_core_file(files, capsys, monkeypatch, where):
    """Without a core file `generate` answers with the embedded model, verified with its own key:
    `--trust KEY.pub` was silently ignored, the operator believing the model checked against it."""
    import helios.cli.generate_cmd as generate_cmd

    def no_load(*args, **kwargs):
        raise AssertionError("loaded a model for a refused command line")

    monkeypatch.setattr(generate_cmd, "_open", no_load)
    trust = ["--trust", files["pub"]]
    code, out, err = run(capsys, "generate", *(trust if where == "before" else ()), "What is 2 + 3?",
                         *(trust if where == "after" else ()))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert one_line(err).startswith("helios generate: error: --trust names the keys a core file is verified with")
    from helios.errors import UsageError

    def reached(args):
        raise UsageError("reached the load")

    monkeypatch.setattr(generate_cmd, "_open", reached)
    monkeypatch.setenv("HELIOS_TRUST", str(files["pub"]))  # a default of every command, not this one's request
    code, _, err = run(capsys, "generate", "What is 2 + 3?")
    assert code == 2 and one_line(err) == "helios generate: error: reached the load\n"
