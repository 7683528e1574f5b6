"""Choices sharing one prompt on CUDA (CUDA graphs, two frames, the PAGE -> PAGE copy on the device):
seeded choices equal separate prefills, greedy ones the CPU path's tokens, and the prompt is computed
once plus one token per further choice."""

from __future__ import annotations

import pytest

from runtime.test_prompt_sharing_runtime import GREEDY, SAMPLED, run_choices

pytestmark = pytest.mark.gpu


def test_seeded_choices_share_the_prompt_on_cuda():
    shared, shared_tokens, _, scheduler = run_choices(4, SAMPLED, device="cuda")
    separate, separate_tokens, _, _ = run_choices(4, SAMPLED, prefix_caching=False, device="cuda")
    assert shared == separate
    assert (shared_tokens, separate_tokens) == (19 + 3, 4 * 19)
    assert scheduler.cache.groups.num_shared_admissions == 3


def test_greedy_choices_on_cuda_equal_the_cpu_path():
    cuda, _, pages, _ = run_choices(4, GREEDY, device="cuda")
    assert cuda == run_choices(4, GREEDY)[0] and len(pages) == 3 + 3
