"""A seeded stress of tensor-parallel serving: `tests/runtime/stress.py`'s request mix through a
core prepared for two ranks (rank 1 a thread of this process), checked against the one-rank core.

`StressRun` draws the scenario as for one engine - arrivals in bursts and at plans and tokens,
shared prefixes, `n` choices of one prompt, output limits down to one, EOS ids, stop sequences,
frontend stops, failing hooks, grammars (an allow-all matcher: the constrained path), logit
biases, log-probabilities, prompt scores, reused ids, cancellations aimed at the ingress channel,
waiting, a prompt chunk, a decode round, a speculative round and some tokens - and here drives the
runtime's engine over a `RankedExecutor` (a small page pool: preemption), while the peer rejects
a few plans after their programs ran (nothing commits: their requests end ERROR). Each request's
output alone comes from the same family's one-rank core (no speculation). `StressRun.check` then
asserts every request's tokens and end against it, one finish each with its counts, and that the
idle engine holds nothing; here also that the peer holds exactly the request records rank zero
holds (both packers applied the same plans, the wire's handles name the same requests), and, for a
run shut down midway, that every rank thread ends.

The dense family (Llama 3) speculates with its first layer as the draft, in two execution frames
(LAUNCH and FINISH messages); the mixture-of-experts family (Qwen3-MoE) runs plain programs in one
frame (STEP messages), some requests sampled with a seed (two ranks draw what one rank draws), and
offloads preempted requests to host pages (plans of copies alone).
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from dataclasses import dataclass, replace

import pytest
import torch

from helios.errors import ExecutionError
from helios.ignition.recipes import load_checkpoint
from helios.runtime.engine import Engine, EngineRequest
from helios.runtime.execution.geometry import capacities_for
from helios.runtime.loading.model import LoadOptions
from helios.runtime.offline import generate
from helios.runtime.parallel.rank_timing import PhaseTimers, run_phase
from helios.runtime.records.capacities import Operation
from helios.runtime.records.events import FinishEvent, FinishReason, TokenEvent
from helios.runtime.records.request import RequestSpec
from helios.runtime.scheduling.policy import PreemptionMode, SchedulerPolicy
from helios.runtime.scheduling.scheduler import Scheduler
from helios.runtime.service import RuntimeOptions, build_runtime
from ignition.hf_checkpoints import LLAMA3_UNTIED, QWEN3_MOE
from runtime import stress
from runtime.stress import DECODE, FAULT, INGRESS, PROMPT, SPECULATING, TOKENS, WAITING, Scenario, StressRun

from .conftest import FAST, MAX_TOKENS, PROMPTS, running

# The dense family's cores: small pages (prefix reuse and preemption at a 4-token grain), four
# lanes, scored prefill; its two-rank core speculates (width 4) with its first layer as the draft.
DENSE_CORE = ("--page-tokens", "4", "--decode-batches", "4", "--no-mixed", "--scored-prefill")


@dataclass(frozen=True)
class Case:
    family: object
    scenario: Scenario
    speculative: bool  # the dense family's cores (the two-rank one speculates); else conftest's cores
    cancelled_in: frozenset[str]  # phases the seed's cancellations reach (together, every phase)


CASES = {
    # seed 38's 20 requests meet every check below (peer rejections, preemption, prefix reuse, shared prompts,
    # cancellations in each phase named) in about two thirds of the CPU of seed 33's 30
    "llama3-speculative-two-frames": Case(LLAMA3_UNTIED, Scenario(
        seed=38, frames=2, num_requests=20, num_pages=20, constrained=0.15, biased=0.1, scored=0.1, logprobs=0.2),
        speculative=True, cancelled_in=frozenset({INGRESS, PROMPT, SPECULATING, TOKENS})),
    # conftest's cores: 16-token pages, two lanes, no scored prefill; seed 35's workload preempts (offloads) and
    # cancels in every phase named (seed 25's stopped preempting once a group's held prompt spared its recompute)
    "qwen3_moe-offload-sampled": Case(QWEN3_MOE, Scenario(
        seed=35, draft="none", family="qwen3_moe", num_requests=24, num_pages=5, preemption=PreemptionMode.OFFLOAD,
        host_pages=8, constrained=0.15, biased=0.1, scored=0.0, logprobs=0.2, sampled=0.2),
        speculative=False, cancelled_in=frozenset({INGRESS, WAITING, DECODE, TOKENS})),
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Rank threads and the test share two busy cores: one intra-op thread each."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _core(cores, case: Case, ranks: int):
    if not case.speculative:
        return cores.open(cores.core(case.family, ranks))
    if ranks == 1:
        return cores.open(cores.custom_core(case.family, 1, "stress", DENSE_CORE))
    draft = ("--draft", str(cores.draft_checkpoint(case.family)), "--speculative-widths", "4")
    return cores.open(cores.custom_core(case.family, ranks, "stress-draft", DENSE_CORE + draft))


@pytest.fixture(scope="module")
def references(cores):
    """Per case: a function of a request spec to its output alone on the family's one-rank core."""
    cache, runtimes = {}, contextlib.ExitStack()

    def alone_on(case: Case):
        if case.family.name not in cache:
            options = RuntimeOptions(ranks=FAST, policy=SchedulerPolicy(speculative=False, prefix_caching=False))
            runtime = build_runtime(_core(cores, case, 1), options)
            runtimes.callback(runtime.close)
            cache[case.family.name] = lambda spec: stress.alone_on(runtime.engine, spec)
        return cache[case.family.name]

    with runtimes:
        yield alone_on


@contextlib.contextmanager
def ranked_run(cores, references, case: Case, monkeypatch):
    """A `StressRun` of `case` whose engine runs the two-rank core (the scenario's pages, host
    pages, queue, policy and frames) and whose outputs alone come from the one-rank core."""
    scenario = case.scenario
    options = RuntimeOptions(load=LoadOptions(num_pages=scenario.num_pages), queue_capacity=scenario.queue_capacity,
                             host_pages=scenario.host_pages, ranks=FAST)
    runtime = build_runtime(_core(cores, case, 2), options)
    try:
        def engine_for(model, policy, host_pages, queue_capacity, frames):
            scheduler = Scheduler.create(capacities_for(model, queue_capacity, host_pages), policy)
            return Engine(scheduler, runtime.engine.executor, runtime.engine.stats, frames=frames)

        alone = references(case)
        monkeypatch.setattr(stress, "stress_model", lambda *args, **kwargs: runtime.model)
        monkeypatch.setattr(stress, "stress_engine", engine_for)
        monkeypatch.setattr(stress, "run_alone", lambda recipe, spec: alone(spec))
        run = StressRun(scenario, load_checkpoint(cores.checkpoint(case.family)))
        monkeypatch.undo()
        yield run, runtime
    finally:
        if "run" in locals():
            run.engine.shutdown()
        runtime.close()


class PeerRejections:
    """Makes the peer reject some plans after its programs ran (its finish fails once the step's
    collectives met): the ranks then agree that nothing commits (`CohortRejected`) and rank zero's
    engine ends the plan's requests ERROR."""

    def __init__(self, runtime, seed: int, rate: float = 0.03):
        (self.executor,) = runtime.peers.peer_executors
        self.rng, self.rate = random.Random(seed), rate
        self.request_ids: set[str] = set()  # of the plans rejected
        self._rejecting: set[int] = set()  # launched plans whose finish fails
        run, launch, finish = self.executor.run, self.executor.launch, self.executor.finish

        def running(plan):
            output = run(plan)
            if self._rejects(plan):
                raise ExecutionError(FAULT)
            return output

        def launching(plan, **options):
            if self._rejects(plan):
                self._rejecting.add(plan.sequence)
            return launch(plan, **options)

        def finishing(launched):
            output = finish(launched)
            if launched.plan.sequence in self._rejecting:
                raise ExecutionError(FAULT)
            return output

        self.executor.run, self.executor.launch, self.executor.finish = running, launching, finishing

    def _rejects(self, plan) -> bool:
        if not plan.rows or self.rng.random() >= self.rate:
            return False
        self.request_ids.update(row.request_id for row in plan.rows)
        return True

    def account(self, run: StressRun) -> int:
        """Marks the rejected plans' requests as failed for `StressRun.check` (their ERROR message is
        the rejection's, which names the peer's failure); returns how many ended so."""
        run.failed_ids |= self.request_ids
        rejected = 0
        for planned in run.planned:
            finish = planned.finishes[0] if planned.finishes else None
            if finish is not None and finish.reason is FinishReason.ERROR and "rejected submission" in finish.message:
                assert "rank 1 rejected" in finish.message and finish.message.endswith(f"Error: {FAULT}"), finish
                planned.finishes[0] = finish._replace(message=FAULT)
                rejected += 1
        return rejected


def _check_ranks(run: StressRun, runtime) -> None:
    """Every peer holds the request records rank zero's packer holds (none but those whose release
    the next plan carries), and the same counts of log-probability and drawing requests; rank zero's
    wire handles name exactly those requests."""
    zero = runtime.peers.executor.packer
    peers = runtime.peers.peer_executors
    assert len(peers) == 1 and all(peer is not None for peer in peers)
    for peer in peers:
        packer = peer.packer
        assert set(packer._requests) == set(zero._requests), (set(packer._requests) ^ set(zero._requests))
        assert (packer._num_logprob_requests, packer._num_drawing_requests) == (
            zero._num_logprob_requests, zero._num_drawing_requests)
    assert set(zero._requests) <= set(run.engine.scheduler._released_ids)
    assert set(runtime.peers.executor._channel._encoder._handles) == set(zero._requests)  # the wire's handles too


@pytest.mark.parametrize("name", CASES)
def test_two_ranks_serve_the_stress_mix_as_one_rank(cores, references, monkeypatch, name):
    case = CASES[name]
    with ranked_run(cores, references, case, monkeypatch) as (run, runtime):
        rejections = PeerRejections(runtime, case.scenario.seed)
        run.run()
        assert rejections.account(run) > 0
        reasons = run.check()
        _check_ranks(run, runtime)
        assert runtime.peers.live_peers == (1,) and runtime.engine.stats.healthy
        counters = run.engine.scheduler.counters()
        assert counters.prefix_reused_tokens > 0 and counters.preemptions > 0, counters
        assert run.engine.scheduler.cache.groups.num_shared_admissions > 0  # n choices shared a prompt's pages
        assert reasons[FinishReason.LENGTH] and reasons[FinishReason.CANCELLED], reasons
        assert case.cancelled_in <= set(run.cancels_sent), run.cancels_sent
        assert (run.operations["SPECULATIVE"] > 0) == case.speculative, run.operations
        served = [p for p in run.planned if p.tokens]
        assert any(p.spec.top_logprobs is not None for p in served)
        assert any(p.spec.score_prompt and p.score_events for p in served) == bool(case.scenario.scored)
        assert any(p.spec.constrained or p.spec.logit_bias for p in served)  # (both: test_two_ranks_mask_and_bias...)
        assert any(not p.spec.sampling.is_greedy for p in served) == bool(case.scenario.sampled)
    assert runtime.peers.live_peers == ()


class Cycling:
    """A grammar that allows at its n-th token only the ids congruent to n modulo 3: a mask that
    changes every token, and most of every rank's vocabulary shard masked."""

    def __init__(self) -> None:
        self.consumed: list[int] = []

    def fill_bitmask(self, row: torch.Tensor) -> None:
        words = [0] * row.numel()
        for token in range(len(self.consumed) % 3, 32 * row.numel(), 3):
            words[token >> 5] |= 1 << (token & 31)
        row.copy_(torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32))

    def consume_token(self, token_id: int) -> bool:
        self.consumed.append(token_id)
        return True


def _grammar_and_bias(core) -> tuple[list, list[list[int]]]:
    """Outputs of requests under a grammar, a logit bias, both, and neither (with log-probabilities),
    served together; and each grammar's consumed tokens."""
    bias = ((8, -100.0), (7, 3.0))  # (8: the plain greedy choice after PROMPTS[1])
    shapes = [(PROMPTS[0], True, ()), (PROMPTS[1], False, bias), (PROMPTS[2], True, bias), (PROMPTS[1][:9], False, ())]
    outputs, grammars = [], []
    with running(core) as runtime:
        for index, (prompt, constrained, logit_bias) in enumerate(shapes):
            spec = RequestSpec(f"g{index}", tuple(prompt), 12, constrained=constrained, logit_bias=logit_bias,
                               top_logprobs=None if constrained or logit_bias else 2)
            events: list = []
            grammar = Cycling() if constrained else None
            grammars += [grammar.consumed] if grammar else []
            outputs.append(events)
            runtime.engine.submit(EngineRequest(spec, events.append, grammar))
        runtime.engine.run_until_idle()
    return [_delivered(events) for events in outputs], grammars


def _delivered(events) -> tuple:
    tokens = [t for e in events if isinstance(e, TokenEvent) for t in e.token_ids]
    logprobs = [round(p.logprob, 3) for e in events if isinstance(e, TokenEvent) for p in e.logprobs or ()]
    (finish,) = [e for e in events if isinstance(e, FinishEvent)]
    return tokens, logprobs, finish.reason, finish.num_output_tokens


def test_two_ranks_mask_and_bias_as_one_rank(cores):
    """Grammar masks (they cross to the peer in the plan) and logit biases apply to each rank's share
    of the vocabulary as to the whole: the speculating two-rank core delivers the one-rank core's
    tokens, each allowed by the grammar at its position."""
    case = CASES["llama3-speculative-two-frames"]
    one, one_consumed = _grammar_and_bias(_core(cores, case, 1))
    two, two_consumed = _grammar_and_bias(_core(cores, case, 2))
    assert two == one and two_consumed == one_consumed
    assert all(reason is FinishReason.LENGTH and count == 12 for _, _, reason, count in two)
    for consumed in two_consumed:
        assert len(consumed) == 12 and all(token % 3 == n % 3 for n, token in enumerate(consumed)), consumed
    assert 8 not in two[1][0] + two[2][0]


def test_two_ranks_shut_down_mid_run(cores, references, monkeypatch):
    """The engine on its worker thread, shut down with requests queued, running and in the
    ingress channel: every request ends once, and closing the runtime ends the rank thread."""
    case = Case(LLAMA3_UNTIED, Scenario(seed=13, frames=2, num_requests=20), speculative=True, cancelled_in=frozenset())
    with ranked_run(cores, references, case, monkeypatch) as (run, runtime):
        run.run_threaded(ended_before_shutdown=6)
        reasons = run.check()
        assert reasons[FinishReason.CANCELLED] > run.cancels_sent[INGRESS], reasons
        runtime.close()
        assert runtime.peers.live_peers == ()


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
