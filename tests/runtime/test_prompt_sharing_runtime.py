"""Choices sharing one prompt with real captured programs: each choice samples with its own seed,
and the tokens equal those of separate prefills (prefix caching off), while the prompt is computed
once plus one token per further choice."""

from __future__ import annotations

from helios.runtime.engine import EngineRequest
from helios.runtime.records.events import TokenEvent
from helios.runtime.loading.model import LoadOptions
from helios.runtime.execution.packer import AdmissionValues
from helios.runtime.scheduling.policy import SchedulerPolicy
from helios.runtime.records.request import RequestSpec
from helios.runtime.service import RuntimeOptions, build_runtime

from .test_model_fixture import open_fixture

PROMPT = tuple(range(3, 22))  # 19 tokens over 8-token pages: 2 shared pages, 2 tokens copied
SAMPLED = (1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0)  # temperature 1, no filter, no penalty
GREEDY = (0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0)
MAX_TOKENS = 10


def run_choices(n: int, parameters, prefix_caching: bool = True, device: str = "cpu"):
    """(tokens per choice, prompt tokens computed, prompt pages, scheduler) of n seeded choices."""
    options = RuntimeOptions(load=LoadOptions(device=device), policy=SchedulerPolicy(prefix_caching=prefix_caching))
    runtime = build_runtime(open_fixture(), options)
    engine, scheduler = runtime.engine, runtime.engine.scheduler
    plans = []
    schedule = scheduler.schedule

    def recording():
        plan = schedule()
        if plan is not None:
            plans.append(plan)
        return plan

    scheduler.schedule = recording
    tokens: dict[str, list[int]] = {}
    for j in range(n):
        request_id = f"choice-{j}"
        tokens[request_id] = []
        spec = RequestSpec(request_id, PROMPT, MAX_TOKENS)
        admission = AdmissionValues(PROMPT, 1000 + j, parameters, MAX_TOKENS, ())

        def record(event, out=tokens[request_id]):
            if isinstance(event, TokenEvent):
                out.extend(event.token_ids)

        engine.submit(EngineRequest(spec, admission, record))
    engine.run_until_idle()
    prompt_tokens = sum(max(0, min(r.start_pos + r.query_len, len(PROMPT)) - r.start_pos)
                        for plan in plans for r in plan.rows)
    pages = sorted({p for plan in plans for r in plan.rows for p in r.new_page_ids
                    if r.start_pos < len(PROMPT)})
    return [tokens[f"choice-{j}"] for j in range(n)], prompt_tokens, pages, scheduler


def test_seeded_choices_equal_separate_prefills_and_compute_the_prompt_once():
    shared, shared_tokens, _, scheduler = run_choices(4, SAMPLED)
    separate, separate_tokens, _, _ = run_choices(4, SAMPLED, prefix_caching=False)
    assert shared == separate
    assert len({tuple(t) for t in shared}) > 1  # four seeds, four different samples
    assert (shared_tokens, separate_tokens) == (19 + 3, 4 * 19)
    assert scheduler.cache.groups.num_shared_admissions == 3
    assert scheduler.counters().prefix_reused_tokens == 3 * 18
    assert all(v.admits_slots for v in scheduler.caps.variants)  # a text core's DECODE admits the choices


def test_greedy_choices_are_identical_and_one_choice_takes_the_same_prompt_pages():
    (first, *others), _, pages4, _ = run_choices(4, GREEDY)
    assert all(t == first for t in others)
    (single,), tokens1, pages1, _ = run_choices(1, GREEDY)
    assert single == first and tokens1 == 19
    # the prompt's 3 pages once, then one private page (for position 18) per further choice
    assert (len(pages1), len(pages4)) == (3, 3 + 3)
