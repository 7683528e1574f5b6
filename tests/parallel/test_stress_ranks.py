"""A seeded stress of tensor-parallel serving: `tests/runtime/stress.py`'s request mix through a
core prepared for two ranks (rank 1 a thread of this process), checked against the one-rank core.

`StressRun` draws the scenario as for one engine - arrivals in bursts and at plans and tokens,
shared prefixes, `n` choices of one prompt, output limits down to one, EOS ids, stop sequences,
frontend stops, failing hooks, grammars (an allow-all matcher: the constrained path), logit
biases, log-probabilities, prompt scores, reused ids, cancellations aimed at the ingress channel,
waiting, a prompt chunk, a decode round, a speculative round and some tokens - and here drives the
runtime's engine over a `RankedExecutor` (a small page pool: preemption). Each request's output
alone comes from the same family's one-rank core (no speculation). `StressRun.check` then asserts
every request's tokens and end against it, one finish each with its counts, and that the idle
engine holds nothing; here also that the peer holds exactly the request records rank zero holds
(both packers applied the same plans), and, for a run shut down midway, that every rank thread ends.

The dense family (Llama 3) speculates with its first layer as the draft; the mixture-of-experts
family (Qwen3-MoE) runs plain programs, some requests sampled with a seed (exact on two ranks: the
draws use the gathered logits), and offloads preempted requests to host pages.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, replace

import pytest
import torch

from helios.ignition.recipes import load_checkpoint
from helios.runtime.engine import Engine, EngineRequest
from helios.runtime.execution.geometry import capacities_for
from helios.runtime.loading.model import LoadOptions
from helios.runtime.offline import generate
from helios.runtime.parallel.rank_timing import PhaseTimers, run_phase
from helios.runtime.records.capacities import Operation
from helios.runtime.records.events import FinishEvent, FinishReason, PromptScoresEvent, TokenEvent
from helios.runtime.records.request import RequestSpec
from helios.runtime.scheduling.policy import PreemptionMode, SchedulerPolicy
from helios.runtime.scheduling.scheduler import Scheduler
from helios.runtime.service import RuntimeOptions, build_runtime
from ignition.hf_checkpoints import LLAMA3, QWEN3_MOE
from runtime import stress
from runtime.stress import DECODE, INGRESS, PROMPT, SPECULATING, TOKENS, WAITING, Alone, Scenario, StressRun

from .conftest import FAST, MAX_TOKENS, PROMPTS, running

@dataclass
class _Pair:
    first: int
    second: int


def test_a_schema_record_first_converted_by_two_loading_threads_gets_every_field(monkeypatch):
    """Thread ranks load their programs beside rank zero, converting the same schema types; a
    record converter filled its field list one field at a time, so a thread converting while
    another was filling it built the record from the fields so far ("TensorMeta.__init__() missing
    2 required positional arguments": rank 1 refused to join)."""
    from helios.abi import program_image

    convert = program_image._record(_Pair)
    build, calls, beside = program_image._converter, [], []

    def converter(hint):  # the second field's converter is built while another thread converts
        calls.append(hint)
        if len(calls) == 2:
            thread = threading.Thread(target=lambda: beside.append(_outcome(convert, {"first": 1, "second": 2})))
            thread.start()
            thread.join()
        return build(hint)

    monkeypatch.setattr(program_image, "_converter", converter)
    assert convert({"first": 3, "second": 4}) == _Pair(3, 4)
    assert beside == [_Pair(1, 2)]


def _outcome(call, *args):
    try:
        return call(*args)
    except Exception as error:  # noqa: BLE001 - the outcome is compared
        return error


def test_an_idle_group_outlives_its_collective_timeout_when_keepalives_are_rarer_than_polls(cores):
    """The monitor polls every 0.5 s and sends a keepalive once the group idled a quarter of the
    collective timeout; with a quarter longer than a poll, a poll that found the group not idle
    long enough restarted the idle time, so no keepalive was ever sent and the peer, waiting for
    rank zero's next message, timed out (the default 60 s timeout: a server idle for a minute
    lost its ranks)."""
    core = cores.open(cores.core(QWEN3_MOE, 2))
    with running(core, replace(FAST, collective_timeout_s=3.0)) as runtime:  # keepalive after 0.75 s idle
        time.sleep(4.5)  # one and a half collective timeouts without a plan
        assert runtime.peers.live_peers == (1,) and runtime.engine.is_healthy, runtime.peers.executor.failure
        results = generate(runtime.engine, PROMPTS, MAX_TOKENS)
    assert [(r.finish_reason, len(r.token_ids)) for r in results] == [(FinishReason.LENGTH, MAX_TOKENS)] * len(PROMPTS)


def test_every_operation_has_a_rank_phase():
    """A plan of cache copies alone (no operation: a preempted request offloaded to host pages) run
    in one exchange is timed as "run.copies"; it had no phase, so the timer's KeyError ended the
    peer and failed rank zero's plan."""
    timers = PhaseTimers()
    for operation in Operation:
        with timers.phase(run_phase(operation)):
            pass
    assert timers.counts["run.copies"] == 1 and sum(timers.counts.values()) == len(Operation)
