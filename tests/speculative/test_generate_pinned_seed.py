"""`helios generate --seed N` pins a sampled prompt's tokens on a speculative core: the prompt alone,
in a batch of other prompts, and with speculation narrowed to width one all give the same tokens
(the seed's plain draws), as a server request with a chosen seed does (`RequestSpec.pinned_seed`).

Before, the command's requests speculated: each verified drafted run draws acceptance and residual
uniforms where its rounds fall, and how many positions a lane gets depends on the lanes beside it,
so the same seed gave other text in a batch."""

from __future__ import annotations

import json

import pytest

from helios.cli.main import main

from .support import ALLOCATING_NAMESPACE, allocating_core

PROMPT = [5, 6, 7]
OTHERS = [[9, 10], [40, 41, 42, 40, 41, 42, 40, 41]]


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    return allocating_core(tmp_path_factory)  # widths 1 and 4, allocating prefixes (test_prepared_core's)


def sampled(core, prompts, capsys, *extra) -> dict[tuple, list[int]]:
    capsys.readouterr()
    code = main(["generate", str(core.core), "--accept", ALLOCATING_NAMESPACE, "--trust", str(core.public_key),
                 "--prompt-ids", json.dumps(prompts), "--max-tokens", "20", "--ignore-eos", "--temperature", "1",
                 "--seed", "3", "--json", *extra])
    assert code == 0
    results = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    return {tuple(r["prompt_ids"]): r["token_ids"] for r in results}


def test_a_seed_gives_a_prompt_the_same_tokens_alone_in_a_batch_and_without_speculation(core, capsys):
    alone = sampled(core, [PROMPT], capsys)[tuple(PROMPT)]
    batch = sampled(core, [OTHERS[0], PROMPT, OTHERS[1]], capsys)
    plain = sampled(core, [PROMPT, *OTHERS], capsys, "--speculative-width", "1")
    assert len(alone) == 20
    assert batch[tuple(PROMPT)] == alone
    assert plain == batch
