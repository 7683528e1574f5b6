"""A tiny random gpt-oss checkpoint prepared into a core and served by the generic runtime on the CPU:
the contract keeps a full paged key/value region (full-attention layers read every page), the
programs call the sinks and expert ABI ops, and a continuous batch gives transformers' greedy tokens
(32 steps each) and the same tokens as each prompt alone."""

from __future__ import annotations

import pytest
import torch
import transformers

from helios.contract import serving_pb2 as spb
from helios.core.keys import SigningKey
from helios.core.reader import open_core
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core
from helios.runtime.offline import generate
from helios.runtime.service import build_runtime
from ignition.hf_checkpoints import GPT_OSS
from support.chat_checkpoint import write_chat_checkpoint

NAMESPACE = "test.helios/gpt-oss"
PROMPTS = [[5, 9, 14, 3, 77, 120, 200, 31, 8], [33, 8, 61], [250, 4, 4, 91, 17, 17, 2]]
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt-oss")
    key = SigningKey.generate()
    checkpoint = write_chat_checkpoint(GPT_OSS, root / "checkpoint", seed=13)
    plan = CapacityPlan(page_tokens=4, context_tokens=64, prefill_tokens=16, decode_batches=(1, 4))
    path = root / "model.core"
    prepare_core(checkpoint, path, key, PrepareOptions(NAMESPACE, capacities=plan))
    return checkpoint, open_core(path, accept=NAMESPACE, trusted_keys=[key.public])


def reference(model, prompt: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def run(core, prompts) -> list[list[int]]:
    runtime = build_runtime(core)
    try:
        return [list(result.token_ids) for result in generate(runtime.engine, prompts, MAX_TOKENS)]
    finally:
        runtime.close()


def test_the_contract_keeps_every_page_and_declares_the_new_ops(prepared):
    contract = prepared[1].prepared
    (region,) = contract.contract.model.cache.regions
    assert region.kind == spb.HISTORY_KIND_PAGED_KEY_VALUE and region.window_tokens == 0
    ops = {handle.graph: set(handle.abi_operations) for handle in contract.manifest.graph_handles}
    sinks = {"prefill": "helios::paged_attention_sinks", "mixed": "helios::paged_attention_sinks",
             "decode": "helios::paged_attention_sinks_tuned"}  # decode reads the tuned split count
    for graph, attention in sinks.items():
        assert {attention, "helios::moe_route", "helios::moe_experts"} <= ops[graph]
        assert not {"helios::paged_attention", "helios::paged_attention_tuned"} & ops[graph]


def test_batched_greedy_tokens_equal_transformers_and_alone(prepared):
    checkpoint, core = prepared
    batched = run(core, PROMPTS)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(checkpoint), attn_implementation="eager")
    for prompt, tokens in zip(PROMPTS, batched):
        assert tokens == reference(model.float().eval(), prompt)
    assert run(core, PROMPTS[1:2]) == batched[1:2]
