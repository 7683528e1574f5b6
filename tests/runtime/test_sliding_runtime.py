"""Sliding-window release through the real runtime: a tiny Mistral (every layer slides over 8
tokens) prepared into a core declares a sliding-window history region; long generations on a pool
far smaller than their whole histories hold a bounded number of pages, reuse released pages, and
still give transformers' greedy tokens (with two execution frames, so a round is always in flight
when pages are released)."""

from __future__ import annotations

import pytest
import torch
import transformers

from helios.contract import serving_pb2 as spb
from helios.core.keys import SigningKey
from helios.core.reader import open_core
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core
from helios.runtime.offline import generate
from helios.runtime.records.request import RELEASED_PAGE
from helios.runtime.service import build_runtime
from ignition.hf_checkpoints import MISTRAL
from support.chat_checkpoint import write_chat_checkpoint

NAMESPACE = "test.helios/sliding"
WINDOW, PAGE_TOKENS, NUM_PAGES = 8, 4, 18
PROMPTS = [[5, 9, 14, 3, 77, 120], [33, 8, 61], [250, 4, 4, 91, 17]]
MAX_TOKENS = 60


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("sliding")
    key = SigningKey.generate()
    checkpoint = write_chat_checkpoint(MISTRAL, root / "checkpoint", seed=11)
    plan = CapacityPlan(page_tokens=PAGE_TOKENS, context_tokens=72, prefill_tokens=16, decode_batches=(1, 4),
                        page_capacity=NUM_PAGES, token_logprobs=False)  # no request asks for logprobs
    path = root / "model.core"
    prepare_core(checkpoint, path, key, PrepareOptions(NAMESPACE, capacities=plan))
    return checkpoint, open_core(path, accept=NAMESPACE, trusted_keys=[key.public])


def greedy(model, prompt: list[int], tokens: list[int]) -> list[int]:
    """transformers' greedy choice after `prompt` followed by each prefix of `tokens`, in one float32
    forward over both (its sliding-window mask is the one it applies step by step): `tokens` is
    transformers' greedy continuation of `prompt` exactly when it equals this."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens[:-1]])).logits
    return logits[0, len(prompt) - 1:].argmax(-1).tolist()


def test_the_core_declares_a_sliding_window_history(prepared):
    (region,) = prepared[1].prepared.contract.model.cache.regions
    assert region.kind == spb.HISTORY_KIND_SLIDING_WINDOW and region.window_tokens == WINDOW


def test_long_generations_hold_bounded_pages_and_match_transformers(prepared):
    checkpoint, core = prepared
    runtime = build_runtime(core)
    engine = runtime.engine
    engine.frames = 2
    scheduler, peaks = engine.scheduler, []
    complete = scheduler.complete

    def observed(plan, results):
        events = complete(plan, results)
        running = scheduler.queues.running
        peaks.append(max((sum(p != RELEASED_PAGE for p in r.page_ids) for r in running), default=0))
        return events

    scheduler.complete = observed
    try:
        results = generate(engine, PROMPTS, MAX_TOKENS)
        counters = scheduler.counters()
    finally:
        runtime.close()
    # 66 positions need 17 pages each (51 for the three) on a pool of 18: without release they
    # would preempt; with it each holds at most its window's pages plus the rounds in flight.
    assert counters.preemptions == 0
    assert max(peaks) <= 4 and len(peaks) > MAX_TOKENS
    assert counters.pages_free + counters.pages_cached == NUM_PAGES
    model = transformers.AutoModelForCausalLM.from_pretrained(str(checkpoint)).float().eval()
    for prompt, result in zip(PROMPTS, results):
        tokens = list(result.token_ids)
        assert len(tokens) == MAX_TOKENS and tokens == greedy(model, prompt, tokens)
