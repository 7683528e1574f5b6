"""A cold prompt's pages form one run of consecutive ids after the pool has been through churn
(`helios.runtime.cache.pages`): the prefill kernel's descriptor path depends on it."""

from __future__ import annotations

from helios.runtime.scheduling.policy import SchedulerPolicy

from .fake_model import reference
from .harness import assert_all_released, make, spec


def request_pages(plans, request_id: str) -> list[int]:
    """The page ids a request's rows added to its table, in order."""
    return [page for plan in plans for row in plan.rows if row.request_id == request_id for page in row.new_page_ids]


def test_a_cold_prompt_after_the_pool_went_round_gets_consecutive_pages():
    policy = SchedulerPolicy(prefix_caching=False)  # finished requests free their pages, tails first
    scheduler, driver = make(policy, num_pages=24, page_tokens=4, context=128, prefill_tokens=64, max_active=8)
    for name, first in (("a", 50), ("b", 60)):  # 30 + 2 tokens: 8 pages each, freed 7, 6, ..., 0
        driver.submit(spec(name, list(range(first, first + 30)), 2))
        driver.run()
    assert request_pages(driver.plans, "a") == list(range(8)) and request_pages(driver.plans, "b") == list(range(8, 16))
    prompt = list(range(3, 43))  # 40 tokens: 10 pages; only 8 never used pages are left (16-23)
    driver.submit(spec("cold", prompt, 2))
    driver.run()
    # a free list in release order would give 16-23, 7, 6: the run of freed pages 0-9 instead
    assert request_pages(driver.plans, "cold")[:10] == list(range(10))
    assert driver.outcomes["cold"].tokens == reference(prompt, 2)
    assert_all_released(scheduler)


def test_a_cold_prompt_after_side_by_side_decoding_gets_consecutive_pages():
    scheduler, driver = make(num_pages=40, page_tokens=4, context=128, prefill_tokens=64, max_active=8)
    # short prompts decoding side by side: their tables grow page by page, interleaved
    driver.submit(*(spec(f"warm{j}", [j + 1] * 6, 14) for j in range(6)))
    driver.run()
    prompt = list(range(3, 43))  # 40 tokens: 10 pages, one row
    driver.submit(spec("cold", prompt, 3))
    driver.run()
    pages = request_pages(driver.plans, "cold")
    assert pages[:10] == list(range(pages[0], pages[0] + 10))
    assert driver.outcomes["cold"].tokens == reference(prompt, 3)
    assert_all_released(scheduler)


def test_chunked_prompt_continues_its_run_where_the_next_ids_are_free():
    scheduler, driver = make(num_pages=64, page_tokens=4, context=256, prefill_tokens=16, max_active=8)
    prompt = list(range(5, 69))  # 64 tokens in chunks of 16: four rows, a page growth each
    driver.submit(spec("long", prompt, 2))
    driver.run()
    pages = request_pages(driver.plans, "long")
    assert pages == list(range(pages[0], pages[0] + len(pages))) and len(pages) >= 16
    assert driver.outcomes["long"].tokens == reference(prompt, 2)
    assert_all_released(scheduler)
