"""Tensor-parallel test cores: tiny chat checkpoints of every family, prepared once per run (one copy
for all the xdist workers) for one rank and for two ranks with the same small capacities
(token-logprobs programs only for the SCORED_FAMILIES), helpers to open and run them, and the
reference greedy tokens (transformers', which a one-rank core gives) the ranks must generate."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch

import helios.ignition.sharding as sharding
from helios.cli.main import main
from helios.core.reader import open_core
from helios.runtime.offline import generate
from helios.runtime.parallel.rank_peers import PeerKind, RankOptions
from helios.runtime.service import RuntimeOptions, build_runtime
from ignition.hf_checkpoints import LLAMA3, QWEN3, QWEN3_MOE
from support.chat_checkpoint import write_chat_checkpoint
from support.shared_prepare import prepared_once, shared_root

NAMESPACE = "test.helios/parallel"
PROMPTS = [
    list(range(3, 23)),  # longer than the 16-token prefill extent: chunked
    list(range(3, 23))[:18] + [7, 8],  # shares a full page with the first: prefix reuse
    [5, 6, 7],
]
MAX_TOKENS = 10
# A hybrid core's snapshot tests: PROMPTS[0], then a prompt that extends it (restoring the snapshot published at
# its end).
RESTORING = [PROMPTS[0], PROMPTS[0] + [7, 8, 9]]
# The families whose cores serve log-probabilities here (test_sharded_sampling, test_cuda); the other
# families' cores are prepared with --no-logprobs: no test runs their token-logprobs programs.
SCORED_FAMILIES = frozenset(family.name for family in (LLAMA3, QWEN3, QWEN3_MOE))
# Small collective timeout: a silent rank fails a test model within seconds (the default is 60 s).
FAST = RankOptions(peers=PeerKind.THREADS, collective_timeout_s=5.0, join_timeout_s=60.0)
# Llama 3's two-rank core (which several files open) is prepared with its weights cut into parts of 32 KiB
# (several resources a rank, loaded by position): test_families' weights-in-parts test checks that on it
# instead of preparing a core of its own.
WEIGHT_PARTS = {(LLAMA3.name, 2): 32 * 1024}
# The rank-process, failure and refusal tests (test_failures, test_hostile_peers, test_generate_cli, test_server,
# test_rank_frames) open Qwen3-MoE's one- and two-rank cores: test_stress_ranks prepares both anyway (an untied
# model, whose greedy tokens depend on the history, unlike the tied Llama 3's).


class Cores:
    """Checkpoints and prepared cores, built on first use and kept for the session."""

    def __init__(self, root: Path, shared: Path):
        """`root`: this process's own directory (for what a test writes beside the cores); `shared`:
        the run's directory for the key, checkpoints and cores (one copy for all xdist workers)."""
        self.root = root
        self.shared = shared
        self.key = shared / "publisher.key"
        prepared_once(shared / "key", shared / ".key-written", lambda: _keygen(self.key, shared / ".key-written"))
        self._checkpoints: dict[tuple[str, int], Path] = {}
        self._cores: dict[str, Path] = {}  # by file name
        self._reference: dict[tuple, list[list[int]]] = {}

    @property
    def trust(self) -> Path:
        return Path(str(self.key) + ".pub")

    def checkpoint(self, family, seed: int = 3) -> Path:
        key = (family.name, seed)
        if key not in self._checkpoints:
            directory = self.shared / f"{family.name}-{seed}"
            written = directory / ".written"
            prepared_once(directory, written, lambda: _write_checkpoint(family, directory, seed, written))
            self._checkpoints[key] = directory
        return self._checkpoints[key]

    def core(self, family, ranks: int, seed: int = 3) -> Path:
        logprobs = () if family.name in SCORED_FAMILIES else ("--no-logprobs",)
        options = ("--decode-batches", "2", "--no-mixed", *logprobs)
        return self._prepared(family, ranks, seed, f"{family.name}-{seed}-tp{ranks}.core", options,
                              WEIGHT_PARTS.get((family.name, ranks)))

    def custom_core(self, family, ranks: int, name: str, options: tuple[str, ...] = (), seed: int = 3) -> Path:
        """A core of `family` for `ranks` ranks prepared with `options` beside the usual context and
        prefill sizes (no other default of `core`: page size, decode batches and programs as `options`
        or `helios prepare` choose), once per run under `name`."""
        return self._prepared(family, ranks, seed, f"{family.name}-{seed}-{name}-tp{ranks}.core", options)

    def _prepared(self, family, ranks: int, seed: int, file: str, options: tuple[str, ...],
                  part_nbytes: int | None = None) -> Path:
        """The core `file` of `family` prepared for `ranks` ranks with `options` (weights in parts of
        `part_nbytes` if given), once per run."""
        if file not in self._cores:
            path = self.shared / file
            checkpoint = self.checkpoint(family, seed)

            def prepare() -> None:
                scratch = path.with_suffix(".partial")
                with pytest.MonkeyPatch.context() as patch:
                    if part_nbytes is not None:
                        patch.setattr(sharding, "WEIGHT_PART_NBYTES", part_nbytes)
                    assert main([
                        "prepare", str(checkpoint), "-o", str(scratch), "--key", str(self.key),
                        "--namespace", NAMESPACE, "--context-tokens", "64", "--prefill-tokens", "16",
                        "--tensor-parallel", str(ranks), *options,
                    ]) == 0
                scratch.rename(path)

            prepared_once(path, path, prepare)
            self._cores[file] = path
        return self._cores[file]

    def draft_checkpoint(self, family, layers: int = 1, seed: int = 3) -> Path:
        """The first `layers` layers of the family's checkpoint (a draft model), written once per run."""
        from speculative.support import write_truncated_checkpoint

        directory = self.shared / f"{family.name}-{seed}-draft{layers}"
        written = directory / ".written"

        def write() -> None:
            write_truncated_checkpoint(self.checkpoint(family, seed), directory, layers)
            written.touch()

        prepared_once(directory, written, write)
        return directory

    def reference_tokens(self, family, prompts: list[list[int]] = PROMPTS) -> list[list[int]]:
        """Greedy tokens of `prompts` (MAX_TOKENS each) from transformers on the family's checkpoint
        (float32), computed once: what one rank serves (each family's recipe tests compare one rank
        with transformers), without preparing and running a one-rank core for each family."""
        key = (family.name, tuple(map(tuple, prompts)))
        if key not in self._reference:
            self._reference[key] = reference_greedy(self.checkpoint(family), prompts, MAX_TOKENS)
        return self._reference[key]

    def open(self, path: Path):
        return open_core(path, accept=NAMESPACE, trusted_keys=[self.trust])

    def cli_trust(self) -> list[str]:
        return ["--accept", NAMESPACE, "--trust", str(self.trust)]


def _keygen(key: Path, written: Path) -> None:
    key.parent.mkdir(parents=True, exist_ok=True)
    assert main(["keygen", "-o", str(key)]) == 0
    written.touch()


def _write_checkpoint(family, directory: Path, seed: int, written: Path) -> None:
    write_chat_checkpoint(family, directory, seed=seed)
    written.touch()


@pytest.fixture(scope="session")
def cores(tmp_path_factory) -> Cores:
    shared = shared_root(tmp_path_factory.getbasetemp()) / "parallel-cores"
    return Cores(tmp_path_factory.mktemp("parallel"), shared)


@contextlib.contextmanager
def running(core, ranks: RankOptions = FAST):
    """A runtime (engine not started) whose peers are closed on exit."""
    runtime = build_runtime(core, RuntimeOptions(ranks=ranks))
    try:
        yield runtime
    finally:
        runtime.close()


def reference_greedy(checkpoint: Path, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """transformers' greedy tokens, each step a full forward (Bamba's cached step skips
    ``time_step_limit``, which its full forward and Helios apply)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for prompt in prompts:
            tokens = list(prompt)
            for _ in range(new_tokens):
                tokens.append(int(model(torch.tensor([tokens])).logits[0, -1].argmax()))
            out.append(tokens[len(prompt):])
    return out


def greedy_tokens(core, ranks: RankOptions = FAST, prompts=PROMPTS) -> list[list[int]]:
    with running(core, ranks) as runtime:
        results = generate(runtime.engine, prompts, MAX_TOKENS)
    assert [r.finish_reason.name for r in results] == ["LENGTH"] * len(prompts), [r.message for r in results]
    return [list(r.token_ids) for r in results]
