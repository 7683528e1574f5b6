"""Choices of one prompt on a layout with a window region of its own page ids (gpt-oss: sliding and
full layers): a choice is not admitted onto another's prompt pages, which would leave it without
the window region's pages of the prompt (no copy reaches them), but reuses the prompt through both
prefix caches, and every choice gives the prompt's output alone (eager programs, `stress.py`)."""

from __future__ import annotations

from helios.ignition.recipes import load_checkpoint
from helios.runtime.engine import EngineRequest
from helios.runtime.records.events import TokenEvent
from helios.runtime.records.request import RequestSpec
from helios.runtime.scheduling.policy import SchedulerPolicy
from ignition.hf_checkpoints import GPT_OSS, random_model, write_checkpoint

from .stress import capacity_plan, run_alone, stress_engine, stress_model

PROMPT = tuple(range(3, 28))  # 25 tokens: six complete pages of 4 and one token


def test_choices_of_one_prompt_keep_their_window_pages(tmp_path):
    recipe = load_checkpoint(write_checkpoint(random_model(GPT_OSS), tmp_path))
    alone = run_alone(recipe, RequestSpec("alone", PROMPT, 8)).tokens
    engine = stress_engine(stress_model(recipe, None, capacity_plan(None)), SchedulerPolicy())
    scheduler = engine.scheduler
    assert scheduler.cache.window is not None  # the layout keeps a window region
    tokens: dict[str, list[int]] = {}
    for name in ("a", "b", "c"):
        def record(event, out=tokens.setdefault(name, [])):
            if isinstance(event, TokenEvent):
                out.extend(event.token_ids)

        engine.submit(EngineRequest(RequestSpec(name, PROMPT, 8), record))
    engine.run_until_idle()
    assert tokens == {"a": alone, "b": alone, "c": alone}
    assert scheduler.cache.groups.num_shared_admissions == 0
    scheduler.check_invariants()
