"""helios::moe_route and helios::moe_experts (CPU references): the transformers routers, the
definition of the expert sum, typed argument errors, and export capture."""

from __future__ import annotations

import pytest
import torch

from helios.abi import moe
from helios.abi.registry import AbiArgumentError, program_ops
from support.moe_inputs import dense_experts, expert_inputs, route_logits

OPS = torch.ops.helios


def _sorted(weights, ids):
    order = ids.argsort(dim=-1)
    return weights.gather(1, order), ids.gather(1, order)


def _hf_config(name, **fields):
    import transformers

    return getattr(transformers, name)(hidden_size=16, **fields)


@pytest.mark.parametrize("normalize", [True, False])
def test_softmax_routing_equals_the_qwen3_moe_router(normalize):
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    config = _hf_config("Qwen3MoeConfig", num_experts=8, num_experts_per_tok=3, norm_topk_prob=normalize)
    router = Qwen3MoeTopKRouter(config)
    torch.nn.init.normal_(router.weight)
    hidden = torch.randn(9, 16)
    _, expected_weights, expected_ids = router(hidden)
    weights, ids = OPS.moe_route(hidden @ router.weight.T, None, "softmax", 3, 1, 1, normalize, 1.0)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int64
    assert torch.equal(ids, expected_ids)
    torch.testing.assert_close(weights, expected_weights, rtol=1e-6, atol=1e-7)


def test_biased_softmax_routing_equals_the_ernie4_5_moe_router():
    """Ernie 4.5 MoE: the choice is the softmax plus the correction bias, the weights the softmax alone
    renormalised (its norm_min floor below every top-k sum)."""
    from transformers.models.ernie4_5_moe.modeling_ernie4_5_moe import Ernie4_5_MoeTopKRouter

    config = _hf_config("Ernie4_5_MoeConfig", moe_num_experts=8, moe_k=3)
    router = Ernie4_5_MoeTopKRouter(config)
    torch.nn.init.normal_(router.weight)
    with torch.no_grad():  # a bias of the softmax's own size moves the choice off the top-k of p
        router.moe_statics.e_score_correction_bias.normal_(std=0.2)
    hidden = torch.randn(9, 16)
    _, expected_weights, expected_ids = router(hidden)
    bias = router.moe_statics.e_score_correction_bias.detach().reshape(-1)
    weights, ids = OPS.moe_route(hidden @ router.weight.T, bias, "softmax", 3, 1, 1, True, 1.0)
    unbiased = OPS.moe_route(hidden @ router.weight.T, None, "softmax", 3, 1, 1, True, 1.0)[1]
    assert torch.equal(ids, expected_ids) and not torch.equal(ids, unbiased)
    torch.testing.assert_close(weights, expected_weights, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("groups,kept,normalize,scale", [(4, 2, True, 2.5), (1, 1, False, 1.0), (2, 1, True, 1.0)])
def test_grouped_sigmoid_routing_equals_the_glm4_moe_router(groups, kept, normalize, scale):
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeTopkRouter

    config = _hf_config("Glm4MoeConfig", n_routed_experts=8, num_experts_per_tok=3, n_group=groups,
                        topk_group=kept, norm_topk_prob=normalize, routed_scaling_factor=scale)
    router = Glm4MoeTopkRouter(config)
    torch.nn.init.normal_(router.weight)
    router.e_score_correction_bias.normal_()
    hidden = torch.randn(11, 16)
    _, expected_weights, expected_ids = router(hidden)
    weights, ids = OPS.moe_route(hidden @ router.weight.T, router.e_score_correction_bias, "sigmoid", 3,
                                 groups, kept, normalize, scale)
    weights, ids = _sorted(weights, ids)
    expected_weights, expected_ids = _sorted(expected_weights, expected_ids)
    assert torch.equal(ids, expected_ids)
    torch.testing.assert_close(weights, expected_weights, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("method,groups,kept,scale", [("greedy", 1, 1, 1.0), ("group_limited_greedy", 4, 2, 16.0),
                                                      ("group_limited_greedy", 8, 3, 1.0)])
def test_softmax_routing_equals_the_deepseek_v2_router(method, groups, kept, scale):
    """DeepSeek-V2: softmax over every expert, groups scored by their best expert (not two), the
    weights the softmax probabilities themselves (never renormalised) times the scale."""
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

    config = _hf_config("DeepseekV2Config", num_attention_heads=4, n_routed_experts=16, num_experts_per_tok=3,
                        n_group=groups, topk_group=kept, topk_method=method, routed_scaling_factor=scale)
    router = DeepseekV2TopkRouter(config)
    torch.nn.init.normal_(router.weight)
    hidden = torch.randn(13, 16)
    _, expected_weights, expected_ids = router(hidden)
    weights, ids = OPS.moe_route(hidden @ router.weight.T, None, "softmax", 3, groups, kept, False, scale)
    weights, ids = _sorted(weights, ids)
    expected_weights, expected_ids = _sorted(expected_weights, expected_ids)
    assert torch.equal(ids, expected_ids)
    torch.testing.assert_close(weights, expected_weights, rtol=1e-6, atol=1e-7)


def test_softmax_groups_score_their_best_expert_not_their_best_two():
    """Group 0 holds the best expert, group 1 the best pair: softmax keeps group 0, sigmoid group 1."""
    logits = torch.tensor([[6.0, -9.0, -9.0, -9.0, 5.0, 5.0, 5.0, -9.0]])
    _, ids = OPS.moe_route(logits, None, "softmax", 2, 2, 1, False, 1.0)
    assert set(ids[0].tolist()) <= {0, 1, 2, 3} and 0 in ids[0].tolist()
    _, ids = OPS.moe_route(logits, None, "sigmoid", 2, 2, 1, False, 1.0)
    assert set(ids[0].tolist()) <= {4, 5, 6, 7}
    weights, ids = OPS.moe_route(torch.tensor([[1.0, 0.0, 3.0, 2.0]]), None, "softmax", 1, 4, 1, False, 1.0)
    assert ids.tolist() == [[2]]  # groups of one expert: each group is its expert
    assert weights.item() == pytest.approx(torch.softmax(torch.tensor([1.0, 0.0, 3.0, 2.0]), 0)[2].item())


def test_group_limit_keeps_experts_of_the_best_groups_only():
    logits = torch.tensor([[5.0, 4.0, -9.0, -9.0, 3.0, 3.0, 3.0, 3.0]])  # group 0 best pair 5+4, group 1: 3+3
    bias = torch.zeros(8)
    _, ids = OPS.moe_route(logits, bias, "sigmoid", 4, 2, 1, True, 1.0)
    assert set(ids[0].tolist()) == {0, 1, 2, 3}  # the -9 experts of group 0 beat group 1's 3s
    weights, ids = OPS.moe_route(logits, bias + torch.tensor([0, 0, 0, 0, 9.0, 0, 0, 0]), "sigmoid", 1, 2, 1,
                                 False, 1.0)
    assert ids.tolist() == [[4]] and weights.item() == pytest.approx(torch.sigmoid(torch.tensor(3.0)).item())


def test_topk_softmax_routing_equals_the_gpt_oss_router():
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssTopKRouter

    config = _hf_config("GptOssConfig", num_local_experts=8, num_experts_per_tok=4)
    router = GptOssTopKRouter(config)
    torch.nn.init.normal_(router.weight)
    torch.nn.init.normal_(router.bias)
    hidden = torch.randn(5, 16)
    _, expected_weights, expected_ids = router(hidden)
    weights, ids = OPS.moe_route(torch.nn.functional.linear(hidden, router.weight, router.bias), None,
                                 "topk_softmax", 4, 1, 1, False, 1.0)
    assert torch.equal(ids, expected_ids)
    torch.testing.assert_close(weights, expected_weights, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("activation", moe.ACTIVATIONS)
@pytest.mark.parametrize("bias", [False, True])
def test_experts_equal_the_per_assignment_definition(activation, bias):
    inputs = expert_inputs(bias=bias, activation=activation)
    out = OPS.moe_experts(**inputs)
    assert out.dtype == torch.float32 and out.shape == inputs["hidden"].shape
    torch.testing.assert_close(out.double(), dense_experts(**inputs), rtol=1e-5, atol=1e-5)


def test_experts_skip_ids_outside_the_local_experts():
    inputs = expert_inputs(tokens=3, top_k=2)
    inputs["ids"] = torch.tensor([[-1, 6], [7, -3], [0, 6]])
    out = OPS.moe_experts(**inputs)
    assert torch.equal(out[:2], torch.zeros_like(out[:2])) and out[2].abs().sum() > 0


def test_experts_in_bfloat16_return_bfloat16():
    inputs = expert_inputs(dtype=torch.bfloat16)
    out = OPS.moe_experts(**inputs)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), dense_experts(**inputs), rtol=3e-2, atol=3e-2)


ROUTE_ERRORS = [
    (dict(logits=torch.zeros(2, 8, dtype=torch.int64)), "logits must be a float"),
    (dict(scoring="argmax"), "scoring 'argmax'"),
    (dict(top_k=9), "top_k 9"),
    (dict(top_k=0), "top_k 0"),
    (dict(num_groups=3), "3 groups"),
    (dict(num_groups=2, topk_groups=3), "3 kept"),
    (dict(scoring="topk_softmax", correction_bias=torch.zeros(8)), "no correction bias"),
    (dict(scoring="softmax", correction_bias=torch.zeros(8), num_groups=2), "correction bias with one group only"),
    (dict(scoring="topk_softmax", num_groups=2), "takes one group"),
    (dict(correction_bias=torch.zeros(7)), "correction_bias must be torch.float32 \\[8\\]"),
    (dict(num_groups=8, topk_groups=1), "at least two experts"),
    (dict(num_groups=4, topk_groups=1, top_k=3), "exceeds the experts of 1 groups"),
]


@pytest.mark.parametrize("change,message", ROUTE_ERRORS)
def test_bad_route_arguments_are_typed_errors(change, message):
    args = dict(logits=torch.zeros(2, 8), correction_bias=None, scoring="sigmoid", top_k=2, num_groups=1,
                topk_groups=1, normalize=True, scale=1.0) | change
    with pytest.raises(AbiArgumentError, match=message):
        OPS.moe_route(**args)


EXPERT_ERRORS = [
    (dict(activation="gelu"), "activation 'gelu'"),
    (dict(hidden=torch.zeros(7, 48, dtype=torch.int32)), "hidden must be a float"),
    (dict(weights=torch.zeros(7, 3, dtype=torch.float64)), "weights must be torch.float32"),
    (dict(ids=torch.zeros(7, 2, dtype=torch.int64)), "ids must be torch.int64 \\[7, 3\\]"),
    (dict(gate_up=torch.zeros(6, 81, 48)), "not gate \\+ up"),
    (dict(down=torch.zeros(6, 48, 39)), "down must be torch.float32 \\[6, 48, 40\\]"),
    (dict(gate_up_bias=torch.zeros(6, 40)), "gate_up_bias must be"),
    (dict(down_bias=torch.zeros(5, 48)), "down_bias must be"),
    (dict(gate_up=torch.zeros(6, 80, 48, dtype=torch.bfloat16)), "gate_up must be torch.float32"),
    (dict(ids=torch.zeros(7, 3, dtype=torch.int64, device="meta")), "share one device"),
]


@pytest.mark.parametrize("change,message", EXPERT_ERRORS)
def test_bad_expert_arguments_are_typed_errors(change, message):
    with pytest.raises(AbiArgumentError, match=message):
        OPS.moe_experts(**(expert_inputs() | change))


class _Block(torch.nn.Module):
    def forward(self, hidden, router, bias, gate_up, down):
        weights, ids = OPS.moe_route(hidden @ router.T, bias, "sigmoid", 2, 2, 1, True, 1.5)
        return OPS.moe_experts(hidden, weights, ids, gate_up, None, down, None, "silu", 1.0, 0.0)


def test_ops_are_captured_by_export_as_opaque_calls():
    inputs = expert_inputs(tokens=5, experts=8, top_k=2)
    args = (inputs["hidden"], torch.randn(8, 48), torch.zeros(8), inputs["gate_up"], inputs["down"])
    tokens = torch.export.Dim("tokens", min=2, max=64)
    program = torch.export.export(_Block(), args, dynamic_shapes=({0: tokens}, None, None, None, None))
    assert program_ops(program) == {"helios::moe_route": "helios::moe_route" + moe.MOE_ROUTE_SCHEMA,
                                    "helios::moe_experts": "helios::moe_experts" + moe.MOE_EXPERTS_SCHEMA}
    torch.testing.assert_close(program.module()(*args), _Block()(*args))


def test_routing_body_never_reads_device_data_on_the_host():
    from support.host_sync import forbid_host_sync

    logits, bias = route_logits(6, 8), torch.randn(8)
    expected = moe.reference_route(logits, bias, "sigmoid", 3, 4, 2, True, 2.0)
    with forbid_host_sync():
        got = moe.reference_route(logits, bias, "sigmoid", 3, 4, 2, True, 2.0)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    meta = moe.reference_route(logits.to("meta"), bias.to("meta"), "sigmoid", 3, 4, 2, True, 2.0)
    assert meta[0].shape == (6, 3)
