"""Settings config.json spells by another name, as each reference's config class reads them.

A transformers config class maps some keys onto others (its ``attribute_map``: Hunyuan MoE's
``num_experts_per_tok`` is ``moe_topk``, Ernie 4.5 MoE's is ``moe_k``, Mixtral's ``num_experts`` is
``num_local_experts``, ...): a config.json that spells a setting by the alias loads the model it
names, and the alias wins over the canonical key beside it. A checkpoint so written must prepare the
reference's model (float32 logits, scored log-probabilities and greedy tokens: test_config_fuzz's
`check_variant`), never the class default in the alias's place nor a refusal.
"""

from __future__ import annotations

import pytest

from helios.ignition.recipes.defaults import with_reference_defaults

from .hf_checkpoints import (
    BAILING_HYBRID, DBRX, DEEPSEEK_V2, ERNIE4_5_MOE, GLM4_MOE, GLM4_MOE_LITE, HUNYUAN_MOE, JETMOE, KIMI_LINEAR, MIXTRAL,
    Family,
)
from .test_config_fuzz import Variant, check_variant


def _value(family: Family, key: str):
    return getattr(family.config(), key)


# (family, canonical key, alias): config.json holds the alias alone, at the reference's value.
ALIASED = [
    (HUNYUAN_MOE, "moe_topk", "num_experts_per_tok"),  # the class default (top-1) was served in its place
    (ERNIE4_5_MOE, "moe_k", "num_experts_per_tok"),  # likewise its class default top-6 (of 6 experts)
    (MIXTRAL, "num_local_experts", "num_experts"),
    (GLM4_MOE, "n_routed_experts", "num_local_experts"),
    (DEEPSEEK_V2, "n_routed_experts", "num_experts"),
    (GLM4_MOE_LITE, "qk_rope_head_dim", "head_dim"),
    (JETMOE, "kv_channels", "head_dim"),
    (DBRX, "n_heads", "num_attention_heads"),
    (KIMI_LINEAR, "num_experts_per_token", "num_experts_per_tok"),  # the default top-8 was read in its place
    (BAILING_HYBRID, "num_experts_per_token", "num_experts_per_tok"),
]


@pytest.mark.parametrize("family, key, alias", ALIASED, ids=lambda value: getattr(value, "name", value))
def test_a_setting_spelled_by_its_alias_prepares_the_reference_model(tmp_path, family, key, alias):
    variant = Variant(family, ((key, None), (alias, _value(family, key))))
    assert check_variant(variant, tmp_path) == "matches"


def test_the_alias_wins_over_the_key_beside_it(tmp_path):
    """transformers sets the canonical attribute from the alias last: Hunyuan MoE's top-2 by
    ``num_experts_per_tok`` beside a ``moe_topk`` of 1 routes top-2."""
    assert _value(HUNYUAN_MOE, "moe_topk") == 2
    variant = Variant(HUNYUAN_MOE, (("moe_topk", 1), ("num_experts_per_tok", 2)))
    assert check_variant(variant, tmp_path) == "matches"


def test_aliases_are_resolved_before_the_defaults_fill_in():
    config = with_reference_defaults("HunYuanMoEV1ForCausalLM", {"num_experts_per_tok": 3, "num_local_experts": 4})
    assert (config["moe_topk"], config["num_experts"]) == (3, 4)
    assert "num_experts_per_tok" not in config and "num_local_experts" not in config
    plain = with_reference_defaults("LlamaForCausalLM", {"num_experts": 3})  # a family without aliases
    assert plain["num_experts"] == 3
