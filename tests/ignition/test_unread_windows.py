"""Window settings a mixture-of-experts family's reference never reads.

GLM-4.5 (Glm4MoeForCausalLM), Hunyuan MoE and Llama 4 attend causally over every position whatever
``sliding_window``, ``use_sliding_window``, ``max_window_layers`` or (GLM, Hunyuan) ``layer_types`` a
config.json carries (Llama 4's own locality is its chunks); PhiMoE slides every layer over its
``sliding_window`` whatever ``use_sliding_window``, ``max_window_layers`` and ``layer_types`` say.
Those keys must not change what Helios attends to: a checkpoint carrying them prepares the
reference's model (test_config_fuzz's `check_variant`: float32 logits, scored log-probabilities and
greedy tokens over a 19-token prompt, past the window of 5), never another one and never a refusal.
"""

from __future__ import annotations

import pytest

from .hf_checkpoints import GLM4_MOE, HUNYUAN_MOE, LLAMA4, PHIMOE, Family
from .test_config_fuzz import Variant, check_variant

_SWITCHED = (("use_sliding_window", True), ("sliding_window", 5), ("max_window_layers", 0))


def _sliding_kinds(family: Family) -> tuple[tuple[str, object], ...]:
    layers = dict(family.overrides).get("num_hidden_layers", 2)
    return ("sliding_window", 5), ("layer_types", ["sliding_attention"] * layers)


UNREAD = [
    (GLM4_MOE, _SWITCHED),
    (GLM4_MOE, _sliding_kinds(GLM4_MOE)),
    (HUNYUAN_MOE, _SWITCHED),
    (HUNYUAN_MOE, _sliding_kinds(HUNYUAN_MOE)),
    (LLAMA4, _SWITCHED),  # (refused before: a chunked layer with a window)
    (Family("llama4-unchunked", LLAMA4.config_class, (*LLAMA4.overrides, ("attention_chunk_size", None))), _SWITCHED),
    # (refused before: the switch made sliding layers of the window-less attention PhiMoE's recipe builds first)
    (Family("phimoe-windowed", PHIMOE.config_class, (*PHIMOE.overrides, ("sliding_window", 5))),
     (("use_sliding_window", True), ("max_window_layers", 1))),
]


def _id(family: Family, keys) -> str:
    return f"{family.name}-{'switched' if dict(keys).get('use_sliding_window') else 'kinds'}"


@pytest.mark.parametrize("family, keys", UNREAD, ids=[_id(*case) for case in UNREAD])
def test_window_keys_the_reference_does_not_read_change_nothing(tmp_path, family, keys):
    assert check_variant(Variant(family, keys), tmp_path) == "matches"
