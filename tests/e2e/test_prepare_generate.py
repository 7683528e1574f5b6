"""prepare -> verify -> load -> generate, end to end on the CPU, through the `helios` commands.

Greedy tokens through the runtime (scheduler, packer, executor, captured programs) must equal
Hugging Face `generate` on the same random checkpoint, for a batch of prompts of different lengths,
including one longer than the prefill extent (chunked prefill) and prompts that share a prefix
(prefix-cache reuse).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch
import transformers

from helios.cli.main import main
from ignition.hf_checkpoints import QWEN3
from support.chat_checkpoint import write_chat_checkpoint

NAMESPACE = "test.helios/e2e"
PROMPTS = [
    list(range(3, 43)),  # longer than the 32-token prefill extent: chunked
    list(range(3, 43))[:35] + [7, 8],  # shares two full pages with the first: prefix reuse
    [5, 6, 7],
    [9],
]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("e2e")
    checkpoint = write_chat_checkpoint(QWEN3, root / "checkpoint", seed=3)
    key = root / "publisher.key"
    assert main(["keygen", "-o", str(key)]) == 0
    core = root / "model.core"
    # --no-logprobs: no request here asks for log-probabilities (the CLI's default, token-logprobs
    # variants prepared, is served in tests/parallel and tests/vision).
    assert main([
        "prepare", str(checkpoint), "-o", str(core), "--key", str(key), "--namespace", NAMESPACE,
        "--context-tokens", "128", "--prefill-tokens", "32", "--prefill-chunks", "8", "--decode-batches", "1,4",
        "--no-logprobs",
    ]) == 0
    return checkpoint, core, Path(str(key) + ".pub")


@functools.cache  # one load for every prompt's reference
def reference_model(checkpoint: Path):
    return transformers.AutoModelForCausalLM.from_pretrained(str(checkpoint)).float().eval()


def reference(checkpoint: Path, prompt: list[int], max_tokens: int) -> list[int]:
    model = reference_model(checkpoint)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_verify_accepts_the_prepared_core(prepared):
    _, core, public = prepared
    assert main(["verify", str(core), "--accept", NAMESPACE, "--trust", str(public)]) == 0
    assert main(["verify", str(core), "--accept", "someone.else", "--trust", str(public)]) == 7


def test_greedy_generate_matches_transformers(prepared, capsys):
    checkpoint, core, public = prepared
    capsys.readouterr()
    code = main([
        "generate", str(core), "--accept", NAMESPACE, "--trust", str(public), "--prompt-ids", json.dumps(PROMPTS),
        "--max-tokens", "24", "--ignore-eos", "--json",
    ])
    assert code == 0
    results = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["prompt_ids"] for r in results] == PROMPTS
    for prompt, result in zip(PROMPTS, results):
        assert result["finish_reason"] == "length"
        assert result["token_ids"] == reference(checkpoint, prompt, 24)


def test_generate_text_prompts_with_chat_template(prepared, capsys):
    _, core, public = prepared
    capsys.readouterr()
    code = main(["generate", str(core), "--accept", NAMESPACE, "--trust", str(public), "--chat", "hello there",
                 "--max-tokens", "8", "--json"])
    assert code == 0
    (result,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert 1 <= len(result["token_ids"]) <= 8
    assert isinstance(result["text"], str)


def test_generate_rejects_bad_prompt_ids(prepared, capsys):
    _, core, public = prepared
    code = main(["generate", str(core), "--accept", NAMESPACE, "--trust", str(public), "--prompt-ids", "[[]]"])
    assert code == 2
    assert "non-empty" in capsys.readouterr().err


def test_generate_refuses_chat_with_prompt_ids(prepared, capsys):
    """--chat renders texts; token ids are used as given (it was accepted and did nothing)."""
    _, core, public = prepared
    capsys.readouterr()
    code = main(["generate", str(core), "--accept", NAMESPACE, "--trust", str(public), "--chat", "--prompt-ids",
                 "[[3, 4]]"])
    assert code == 2
    assert "--chat renders prompt texts" in capsys.readouterr().err


def test_generate_refuses_an_empty_text_prompt_as_a_usage_error(prepared, capsys):
    """A prompt with no tokens is the operator's mistake (exit 2, naming which prompt), not a
    rejected request of the engine (exit 9)."""
    _, core, public = prepared
    capsys.readouterr()
    code = main(["generate", str(core), "--accept", NAMESPACE, "--trust", str(public), "hello", ""])
    err = capsys.readouterr().err
    assert code == 2
    assert err.splitlines()[-1] == "helios generate: error: prompt 2 is empty: it has no tokens to generate from"
    assert "Traceback" not in err


@pytest.mark.parametrize("device, message", [
    ("tpu:0", "not a device"), ("mps", "CPU or on CUDA"), ("cuda:99", "CUDA"),
])
def test_generate_rejects_a_device_it_cannot_use(prepared, capsys, device, message):
    _, core, public = prepared
    capsys.readouterr()
    code = main(["generate", str(core), "--accept", NAMESPACE, "--trust", str(public), "--prompt-ids", "[[3, 4]]",
                 "--device", device])
    err = capsys.readouterr().err
    assert code != 0 and message in err
    assert "Traceback" not in err


def test_a_short_prompt_alone_runs_the_smallest_prefill_program(prepared):
    """--prefill-chunks 8 captures PREFILL and MIXED at 8 prompt tokens beside 32; a 3-token prompt
    runs the 8-token PREFILL program, a 40-token prompt the 32-token one (chunked)."""
    from helios.core.reader import open_core
    from helios.runtime.execution import executor as executor_module
    from helios.runtime.offline import generate
    from helios.runtime.service import build_runtime

    _, core, public = prepared
    runtime = build_runtime(open_core(core, accept=NAMESPACE, trusted_keys=[public]))
    shapes = {(p.graph, p.batch_capacity, p.packed_token_capacity) for p in runtime.model.programs}
    assert {("prefill", 1, 8), ("prefill", 1, 32), ("mixed", 4, 12), ("mixed", 4, 36)} <= shapes
    ran: list[str] = []
    launch = executor_module.Executor.launch

    def recording(self, plan, *, alone=False):
        if plan.variant is not None:
            ran.append(plan.variant.name)
        return launch(self, plan, alone=alone)

    executor_module.Executor.launch = recording
    try:
        generate(runtime.engine, [[5, 6, 7]], 1)
        assert ran == ["prefill.r1t8"]
        ran.clear()
        generate(runtime.engine, [list(range(50, 90))], 1)
        assert ran[0] == "prefill.r1t32" and ran[-1] == "prefill.r1t8"
    finally:
        executor_module.Executor.launch = launch


def test_prepare_rejects_prefill_chunks_outside_the_prefill_extent(prepared, tmp_path, capsys):
    checkpoint, _, public = prepared
    key = Path(str(public).removesuffix(".pub"))
    code = main(["prepare", str(checkpoint), "-o", str(tmp_path / "bad.core"), "--key", str(key), "--namespace",
                 NAMESPACE, "--prefill-tokens", "32", "--prefill-chunks", "32"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "--prefill-chunks must each be smaller than the prefill tokens (32, --prefill-tokens)" in err


def test_serving_below_the_largest_batch_keeps_every_token_capacity_of_the_next_one(prepared):
    """At concurrency 2 the 4-row MIXED programs are the smallest that hold it: both of their token
    capacities (8 and 32 prompt tokens) are loaded, not only the smaller one."""
    from helios.core.reader import open_core
    from helios.runtime.loading.model import select_handles

    _, core, public = prepared
    contract = open_core(core, accept=NAMESPACE, trusted_keys=[public]).prepared
    shapes = {(h.graph, h.capacity.batch_capacity, h.capacity.packed_token_capacity)
              for h in select_handles(contract, 2)}
    assert {("mixed", 4, 12), ("mixed", 4, 36), ("prefill", 1, 8), ("prefill", 1, 32), ("decode", 1, 1),
            ("decode", 4, 4)} <= shapes
