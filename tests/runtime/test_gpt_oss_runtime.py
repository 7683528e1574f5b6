"""A tiny random gpt-oss checkpoint prepared into a core and served by the generic runtime on the CPU:
the contract keeps a full paged key/value region (full-attention layers read every page) and a
sliding-window region of its own page ids for the sliding layers, the programs call the sinks and
expert ABI ops, and a continuous batch gives transformers' greedy tokens (32 steps each, well past the
6-token window) and the same tokens as each prompt alone, while the window pool holds only the pages
in reach of each request's window."""

from __future__ import annotations

import pytest
import torch
import transformers

from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb
from helios.core.keys import SigningKey
from helios.core.reader import open_core
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core
from helios.runtime.offline import generate
from helios.runtime.loading.model import LoadOptions
from helios.runtime.loading.page_sizing import other_bytes, page_bytes
from helios.runtime.service import RuntimeOptions, build_runtime
from helios.runtime.cache.window_pages import WindowPagesError
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
    # No token-logprobs programs: no request here asks for log-probabilities.
    plan = CapacityPlan(page_tokens=4, context_tokens=64, prefill_tokens=16, decode_batches=(1, 4),
                        token_logprobs=False)
    path = root / "model.core"
    prepare_core(checkpoint, path, key, PrepareOptions(NAMESPACE, capacities=plan))
    return checkpoint, open_core(path, accept=NAMESPACE, trusted_keys=[key.public])


def is_greedy(model, prompt: list[int], tokens: list[int]) -> bool:
    """Whether `tokens` is transformers' greedy continuation of `prompt` for MAX_TOKENS tokens: each
    is its argmax after the prompt and the tokens before it (one float32 forward over both; the eager
    sliding-window mask is the one it applies step by step)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens[:-1]])).logits
    return len(tokens) == MAX_TOKENS and tokens == logits[0, len(prompt) - 1:].argmax(-1).tolist()


def run(core, prompts) -> list[list[int]]:
    runtime = build_runtime(core)
    try:
        return [list(result.token_ids) for result in generate(runtime.engine, prompts, MAX_TOKENS)]
    finally:
        runtime.close()


def test_the_contract_splits_sliding_layers_into_their_own_region_and_declares_the_new_ops(prepared):
    """Layers 0 and 2 slide (window 6): their planes form a SLIDING_WINDOW region sized by its own
    page count and indexed by its own table; layers 1 and 3 keep a full key/value region."""
    contract = prepared[1].prepared
    cache = contract.contract.model.cache
    full, window = cache.regions
    assert (full.name, full.kind, list(full.planes), full.window_tokens) == (
        "attention", spb.HISTORY_KIND_PAGED_KEY_VALUE, ["k_cache", "v_cache"], 0)
    assert (window.name, window.kind, list(window.planes), window.window_tokens) == (
        "window", spb.HISTORY_KIND_SLIDING_WINDOW, ["window_k_cache", "window_v_cache"], 6)
    assert [(v.destination, v.region) for v in cache.page_table_views] == [
        ("page_table", "attention"), ("window_page_table", "window")]
    buffers = {b.name: b for b in contract.manifest.buffers}
    assert buffers["k_cache"].shape[0].size == 2 and buffers["k_cache"].shape[1].load_extent == mpb.LOAD_EXTENT_PHYSICAL_PAGES
    assert buffers["window_k_cache"].shape[0].size == 2
    assert buffers["window_k_cache"].shape[1].load_extent == mpb.LOAD_EXTENT_WINDOW_PAGES
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
        assert is_greedy(model.float().eval(), prompt, tokens)
    assert run(core, PROMPTS[1:2]) == batched[1:2]


def test_a_window_pool_smaller_than_one_history_serves_past_the_window(prepared):
    """41 positions need 11 pages of every layer; the sliding layers get 9 pages in all, the least one
    request's window (6) plus one round of the widest program (mixed: 20 tokens) needs: released
    window pages are reused while the full layers keep all 11, and the tokens equal transformers'.
    The default count is what every slot's window can reach, not the context."""
    checkpoint, core = prepared
    default = build_runtime(core)
    try:
        geometry = default.engine.scheduler.caps.cache
        assert geometry.layout.window_region == "window"
        # max_active 4 x (ceil((6 - 1 + 2 * 20) / 4) + 2 = 14, at most a 16-page context)
        assert geometry.num_window_pages == default.model.num_window_pages == 4 * 14
    finally:
        default.close()
    with pytest.raises(WindowPagesError, match="at least 9 are needed"):
        build_runtime(core, RuntimeOptions(load=LoadOptions(window_pages=8)))
    runtime = build_runtime(core, RuntimeOptions(load=LoadOptions(window_pages=9)))
    try:
        assert runtime.model.buffers["window_k_cache"].shape[:2] == (2, 9)
        (result,) = generate(runtime.engine, PROMPTS[:1], MAX_TOKENS)
        window_pool = runtime.engine.scheduler.cache.window.pool
        assert window_pool.num_pages == 9 and window_pool.num_available == 9
        counters = runtime.engine.scheduler.counters()
        assert counters.preemptions == 0 and counters.window_pages_total == 9
        assert counters.window_pages_free + counters.window_pages_cached == 9
    finally:
        runtime.close()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(checkpoint), attn_implementation="eager")
    assert is_greedy(model.float().eval(), PROMPTS[0], list(result.token_ids))


def test_window_pages_are_budgeted_apart_from_the_shared_pages(prepared):
    """A shared page costs the full layers' planes only; each window page the sliding layers'."""
    contract = prepared[1].prepared
    # [2 layers, pages, 4 tokens, 2 kv heads, 16] float32, keys and values
    assert page_bytes(contract) == 2 * (2 * 4 * 2 * 16 * 4)
    window_page = 2 * (2 * 4 * 2 * 16 * 4)
    assert other_bytes(contract, 4, num_window_pages=10) - other_bytes(contract, 4) == 10 * window_page


def test_a_prefix_hit_past_the_window_equals_transformers(prepared):
    """A second prompt sharing 16 tokens (4 pages) with a finished one reuses its full pages and the
    window pages a query at position 16 reads (positions 11.., pages 2 and 3; pages 0 and 1 were
    released and are not needed), and still generates transformers' tokens."""
    checkpoint, core = prepared
    first = [7, 19, 3, 88, 41, 6, 250, 12, 9, 77, 31, 4, 160, 2, 58, 23, 99, 14]
    second = first[:16] + [201, 5, 66]
    runtime = build_runtime(core)
    try:
        (one,) = generate(runtime.engine, [first], MAX_TOKENS)
        (two,) = generate(runtime.engine, [second], MAX_TOKENS)
        counters = runtime.engine.scheduler.counters()
        assert counters.prefix_reused_tokens == 16
    finally:
        runtime.close()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(checkpoint), attn_implementation="eager").float().eval()
    assert is_greedy(model, first, list(one.token_ids))
    assert is_greedy(model, second, list(two.token_ids))
