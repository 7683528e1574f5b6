"""Two execution frames through the real runtime on the CPU: decode rounds fed by device-owned
pending tokens are submitted behind the round in flight and give exactly the one-frame tokens.

A tiny random checkpoint is prepared into a core (its DECODE programs keep `pending_tokens`); the
engine is forced to two frames (on CUDA it chooses them itself). On the CPU a launch completes at
once, but the second frame still reads its tokens from the device state the first one wrote.
"""

from __future__ import annotations

import random

import pytest

from helios.core.keys import SigningKey
from helios.core.reader import open_core
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core
from helios.runtime.records.events import FinishReason
from helios.runtime.execution.geometry import device_pending
from helios.runtime.offline import generate
from helios.runtime.records.sampling_params import GREEDY, SamplingParams
from helios.runtime.service import build_runtime
from ignition.hf_checkpoints import QWEN3
from support.chat_checkpoint import write_chat_checkpoint
from support.engine_soak import EngineSoak, SoakSettings, check_soak

NAMESPACE = "test.helios/frames"
_CHOOSER = random.Random(5)
PROMPTS = [[_CHOOSER.randrange(3, 300) for _ in range(n)] for n in (1, 4, 17, 33, 40)]
MAX_TOKENS = 12
# temperature, top_k, top_p, min_p, repetition, presence, frequency: penalties read the device
# histogram of output tokens, which a second frame must see updated by the first.
SAMPLED = SamplingParams.from_packed((0.8, 40.0, 0.95, 0.0, 1.3, 0.2, 0.1), seed=1234)


@pytest.fixture(scope="module")
def core_path(tmp_path_factory):
    root = tmp_path_factory.mktemp("frames")
    key = SigningKey.generate()
    checkpoint = write_chat_checkpoint(QWEN3, root / "checkpoint", seed=7)
    # No token-logprobs programs: no request here asks for log-probabilities.
    plan = CapacityPlan(context_tokens=128, prefill_tokens=16, decode_batches=(1, 4, 8), token_logprobs=False)
    path = root / "model.core"
    prepare_core(checkpoint, path, key, PrepareOptions(NAMESPACE, capacities=plan))
    return path, key


def _open(core_path):
    path, key = core_path
    return open_core(path, accept=NAMESPACE, trusted_keys=[key.public])


def _generate(core_path, frames: int, sampling: SamplingParams = GREEDY):
    runtime = build_runtime(_open(core_path))
    runtime.engine.frames = frames
    try:
        results = generate(runtime.engine, PROMPTS, MAX_TOKENS, sampling=sampling)
        return [list(r.token_ids) for r in results], runtime.engine.stats.second_frames, results
    finally:
        runtime.close()


def test_prepared_decode_keeps_its_pending_token_on_the_device(core_path):
    prepared = _open(core_path).prepared
    decode = prepared.graphs["decode"]
    assert decode.pending_token_view == "pending_tokens"
    assert device_pending(prepared, "decode")
    assert not device_pending(prepared, "prefill") and not device_pending(prepared, "mixed")


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled-with-penalties"])
def test_two_frames_give_the_one_frame_tokens(core_path, sampling):
    one, none_behind, _ = _generate(core_path, 1, sampling)
    two, behind, results = _generate(core_path, 2, sampling)
    assert none_behind == 0
    assert behind >= MAX_TOKENS - 4  # most decode rounds ran behind another one
    assert two == one
    assert all(r.finish_reason == FinishReason.LENGTH for r in results)


def test_two_frames_stop_at_eos_without_emitting_past_it(core_path):
    (reference,), _, _ = _generate_one(core_path, 1, ())
    eos = reference[5]  # a token the model emits: with it as EOS, generation ends there
    (tokens,), behind, (result,) = _generate_one(core_path, 2, (eos,))
    assert tokens == reference[: reference.index(eos) + 1]
    assert result.finish_reason == FinishReason.EOS
    assert behind > 0


def _generate_one(core_path, frames: int, eos_ids):
    runtime = build_runtime(_open(core_path))
    runtime.engine.frames = frames
    try:
        results = generate(runtime.engine, PROMPTS[2:3], MAX_TOKENS, eos_ids=eos_ids)
        return [list(r.token_ids) for r in results], runtime.engine.stats.second_frames, results
    finally:
        runtime.close()


def test_soak_with_two_frames_ends_every_request_and_frees_every_page(core_path):
    runtime = build_runtime(_open(core_path))
    runtime.engine.frames = 2
    try:
        settings = SoakSettings(num_requests=60, seed=9, max_prompt=40, max_tokens=10, warmup=20)
        soak = EngineSoak(runtime.engine, settings)
        soak.run()
        reasons = check_soak(soak)
        assert runtime.engine.stats.second_frames > 10  # arrivals and prefills interrupt the pairs
    finally:
        runtime.close()
    assert reasons[FinishReason.CANCELLED] >= 1 and reasons[FinishReason.LENGTH] >= 30, reasons


def test_a_failed_second_frame_ends_its_requests_once_and_leaves_nothing_submitted(core_path):
    runtime = build_runtime(_open(core_path))
    engine = runtime.engine
    engine.frames = 2
    launch, calls = engine.executor.launch, []

    def failing_second_frame(plan, *, alone=False):
        calls.append(plan)
        if any(row.pending_on_device for row in plan.rows) and len(calls) > 4:
            raise RuntimeError("injected launch failure")
        return launch(plan, alone=alone)

    engine.executor.launch = failing_second_frame
    try:
        results = generate(engine, PROMPTS, MAX_TOKENS)
        counters = engine.scheduler.counters()
        assert not engine._launched and engine.scheduler.num_inflight == 0
        assert counters.pages_free + counters.pages_cached == counters.pages_total
    finally:
        runtime.close()
    reasons = [r.finish_reason for r in results]
    assert FinishReason.ERROR in reasons
    assert all("injected launch failure" in r.message for r in results if r.finish_reason == FinishReason.ERROR)
