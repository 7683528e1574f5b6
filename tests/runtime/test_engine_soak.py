"""The engine soak and greedy-run drivers of the CUDA runtime tests, run here on the CPU.

tests/gpu/test_runtime_cuda.py soaks a CUDA engine with 2000 requests and an allocation probe, and
compares greedy tokens and logits between devices; these are the same drivers on the committed
fixture core, so their use of the engine API is checked on every machine.
"""

from __future__ import annotations

from helios.runtime.records.events import FinishReason
from helios.runtime.service import build_runtime
from support.engine_soak import EngineSoak, SoakSettings, check_soak, greedy_completed
from support.runtime_runs import greedy_run, logits_error

from .test_model_fixture import open_fixture


def test_engine_soak_ends_every_request_and_frees_every_page():
    runtime = build_runtime(open_fixture())
    settings = SoakSettings(num_requests=70, seed=3, max_prompt=40, max_tokens=10, warmup=25)
    soak = EngineSoak(runtime.engine, settings, probe=lambda: sum(bool(r.finishes) for r in soak.requests.values()))
    soak.run()
    reasons = check_soak(soak)
    assert reasons[FinishReason.CANCELLED] >= 3 and reasons[FinishReason.LENGTH] >= 40, reasons
    assert soak.readings == [25, 70]  # read once after the warm-up and once at the end
    assert runtime.engine.scheduler.counters().prefix_reused_tokens > 0

    # Greedy requests that ran to their limit under churn got the tokens of a quiet run.
    picked = greedy_completed(soak)[:6]
    assert len(picked) == 6
    quiet = greedy_run(open_fixture(), [r.prompt for r in picked], settings.max_tokens)
    for request, tokens in zip(picked, quiet.tokens):
        assert request.tokens == tokens[:request.max_tokens], request.request_id
    for tokens, logits in zip(quiet.tokens, quiet.logits):  # the logits recorded are the sampled rows'
        assert tokens == [int(row.argmax()) for row in logits]
    assert logits_error(quiet, quiet) == 0.0 and not quiet.captured
