"""A DeepSeek-V3 core end to end: `helios prepare` with the checkpoint as its own draft, the captured
programs loaded by the generic runtime, generating exactly what transformers generates greedily.

Two dense and two mixture-of-experts layers with latent attention; the target and the draft each keep
a paged latent region. Speculative decoding equals plain decoding equals transformers, and prompts
served from the prefix cache equal cold runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from helios.cli.main import main
from helios.contract import StartupOptions
from helios.contract import serving_pb2 as spb
from helios.core.reader import open_core
from helios.runtime.loading.model import LoadOptions
from helios.runtime.offline import generate
from helios.runtime.scheduling.policy import SchedulerPolicy
from helios.runtime.service import RuntimeOptions, build_runtime
from ignition.hf_checkpoints import DEEPSEEK
from support.chat_checkpoint import write_chat_checkpoint

from .support import Counting

pytestmark = pytest.mark.slow
NAMESPACE = "test.helios/deepseek"
SHARED = [11, 40, 7, 250, 3, 99, 18, 64, 5, 12]  # two full pages of 4 tokens and a half
PROMPTS = [SHARED + [31, 32, 33], [5, 6, 7], SHARED + [200, 201]]
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("deepseek")
    checkpoint = write_chat_checkpoint(DEEPSEEK, root / "checkpoint", seed=3)
    key = root / "publisher.key"
    assert main(["keygen", "-o", str(key)]) == 0
    core = root / "model.core"
    assert main([
        "prepare", str(checkpoint), "-o", str(core), "--key", str(key), "--namespace", NAMESPACE,
        "--page-tokens", "4", "--context-tokens", "64", "--prefill-tokens", "16", "--decode-batches", "2",
        "--no-mixed", "--draft", str(checkpoint), "--speculative-widths", "3",
        "--no-logprobs",  # no request here asks for log-probabilities
    ]) == 0
    return checkpoint, core, Path(str(key) + ".pub")


@pytest.fixture(scope="module")
def expected(prepared) -> list[list[int]]:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(prepared[0])).float().eval()
    tokens = []
    for prompt in PROMPTS:
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
        tokens.append(out[0, len(prompt):].tolist())
    return tokens


def run(prepared, startup: StartupOptions = StartupOptions(), policy: SchedulerPolicy = SchedulerPolicy(),
        rounds: int = 1):
    """Tokens of PROMPTS (each round after the previous one finished), counting, scheduler counters."""
    _, core, public = prepared
    runtime = build_runtime(open_core(core, accept=NAMESPACE, trusted_keys=[public]),
                            RuntimeOptions(load=LoadOptions(startup=startup), policy=policy))
    counting = Counting()
    counting.wrap(runtime.engine.executor)
    outputs = []
    for _ in range(rounds):
        results = generate(runtime.engine, PROMPTS, MAX_TOKENS)
        assert [r.finish_reason.name for r in results] == ["LENGTH"] * len(PROMPTS)
        outputs.append([list(r.token_ids) for r in results])
    return outputs, counting, runtime.engine.scheduler.counters()


def test_target_and_draft_keep_paged_latent_regions(prepared):
    _, core, public = prepared
    contract = open_core(core, accept=NAMESPACE, trusted_keys=[public]).prepared
    regions = [(r.name, r.kind, list(r.planes), r.tokens_per_record) for r in contract.contract.model.cache.regions]
    assert regions == [("attention", spb.HISTORY_KIND_PAGED_LATENT, ["latent_cache", "rope_cache"], 1),
                       ("draft", spb.HISTORY_KIND_PAGED_LATENT, ["draft_latent_cache", "draft_rope_cache"], 1)]
    assert contract.buffers["latent_cache"].shape[2:] == (4, 32)
    ops = {op.name for op in contract.manifest.abi_operations}
    assert {"helios::latent_cache_write", "helios::paged_latent_attention", "helios::moe_route",
            "helios::moe_experts"} <= ops


@pytest.fixture(scope="module")
def plain(prepared):
    """Plain decoding (no speculation), PROMPTS twice: the second time from the prefix cache."""
    return run(prepared, StartupOptions(learned_speculation=False), rounds=2)


def test_speculative_decoding_equals_plain_decoding_and_transformers(prepared, plain, expected):
    (speculative,), counting, _ = run(prepared)
    assert counting.rounds > 0 and counting.accepted > 0  # the draft is the target: it is accepted
    (cold, _), plain_counting, _ = plain
    assert plain_counting.rounds == 0
    assert speculative == cold == expected


def test_prefix_cache_hits_equal_cold_runs(plain, expected):
    """The second round finds every prompt's full pages cached (the first round ran them cold; its
    third prompt already reused the first one's shared pages)."""
    (cold, cached), _, counters = plain
    assert counters.prefix_reused_tokens >= 8 * 3
    assert cached == cold == expected
