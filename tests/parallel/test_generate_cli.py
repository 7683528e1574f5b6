"""`helios generate` on a two-rank core runs rank 1 as a local process (no option needed: the core
says how many ranks it has; in HELIOS_RANK_PROCESS_SWEEP) and prints the tokens one rank generates;
a rank on "another host" (a `helios rank --join` process on loopback) gives the same tokens."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

from helios.cli.main import main
from ignition.hf_checkpoints import QWEN3_MOE
from support.sweeps import swept

from .conftest import MAX_TOKENS, PROMPTS


def cli_tokens(cores, core, capsys, *extra: str) -> list[list[int]]:
    capsys.readouterr()
    code = main(["generate", str(core), *cores.cli_trust(), "--prompt-ids", json.dumps(PROMPTS),
                 "--max-tokens", str(MAX_TOKENS), "--ignore-eos", "--json", *extra])
    output = capsys.readouterr().out
    assert code == 0, output
    results = [json.loads(line) for line in output.splitlines()]
    assert [r["finish_reason"] for r in results] == ["length"] * len(PROMPTS)
    return [r["token_ids"] for r in results]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# Only with HELIOS_RANK_PROCESS_SWEEP=1 (one more rank process, for the suite's time): test_serve_ranks' `helios serve`
# starts a two-rank core's rank 1 as a local process with no option (the runtime's default, which `helios generate`
# takes too), test_rank_frames' and test_server's runtimes do so with processes, and the test below runs `helios generate`
# on the two-rank core.
if swept("HELIOS_RANK_PROCESS_SWEEP"):
    def test_generate_runs_local_rank_processes(cores, capsys):
        assert cli_tokens(cores, cores.core(QWEN3_MOE, 2), capsys) == cores.reference_tokens(QWEN3_MOE)


def test_a_rank_joining_over_loopback_gives_the_same_tokens(cores, capsys):
    core, address = cores.core(QWEN3_MOE, 2), f"127.0.0.1:{free_port()}"
    joiner = subprocess.Popen([sys.executable, "-m", "helios.cli.main", "rank", str(core), "--join", address,
                               *cores.cli_trust(), "--torch-threads", "1"], stderr=subprocess.PIPE, text=True)
    try:
        two = cli_tokens(cores, core, capsys, "--local-ranks", "1", "--rendezvous", address)
        _, stderr = joiner.communicate(timeout=60)
    finally:
        joiner.kill()
    assert two == cores.reference_tokens(QWEN3_MOE)
    assert joiner.returncode == 0
    assert "serving rank 1 of 2" in stderr


def test_local_ranks_for_a_core_of_one_rank_are_refused(cores, capsys):
    """--local-ranks 2 on a one-rank core was accepted and ignored (one process served it)."""
    capsys.readouterr()
    code = main(["generate", str(cores.core(QWEN3_MOE, 1)), *cores.cli_trust(), "--prompt-ids", json.dumps(PROMPTS),
                 "--max-tokens", "2", "--local-ranks", "2"])
    err = capsys.readouterr().err
    assert code != 0 and "2 local ranks for a core of 1 rank" in err and "Traceback" not in err
