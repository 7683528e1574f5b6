"""Rank sharding at preparation time: every rank's weights follow the rank's layout, the shards put
back together are the whole model, and the per-rank weight catalogs describe the stored bytes."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors.torch import load as load_safetensors

from helios.contract import manifest_pb2 as mpb
from helios.ignition.architecture import Architecture, CheckpointError, weight_layout
from helios.ignition.recipes.base import NamedWeight, Recipe
from helios.ignition.recurrent_geometry import RecurrentGeometry
from helios.ignition.sharding import rank_architecture, rank_weight_files, rank_weights, weight_parts, weight_resources

ARCH = Architecture(vocab_size=11, hidden_size=8, intermediate_size=6, num_layers=1, num_heads=4, num_kv_heads=2,
                    head_dim=2, rms_norm_eps=1e-5, layer_windows=(0,), qkv_bias=True, o_bias=True, mlp_bias=True)


def numbered_recipe(arch: Architecture = ARCH) -> Recipe:
    """Every weight element holds a distinct number, so a misplaced row or column shows."""
    weights, start = [], 0
    for slot in weight_layout(arch):
        count = 1
        for extent in slot.shape:
            count *= extent
        weights.append(NamedWeight(slot.name, torch.arange(start, start + count, dtype=torch.float32).reshape(slot.shape)))
        start += count
    return Recipe("numbered", arch, tuple(weights))


def test_rank_architecture_divides_heads_and_mlp_and_keeps_the_vocabulary():
    shard = rank_architecture(ARCH, 2)
    assert (shard.num_heads, shard.num_kv_heads, shard.intermediate_size) == (2, 1, 3)
    assert (shard.vocab_size, shard.vocab_rows, shard.tensor_parallel) == (11, 6, 2)
    assert rank_architecture(ARCH, 1) is ARCH


def test_uneven_heads_are_refused_by_name():
    with pytest.raises(CheckpointError, match="key/value heads \\(num_key_value_heads\\) 2"):
        rank_architecture(ARCH, 4)
    with pytest.raises(CheckpointError, match="MLP width"):
        rank_architecture(dataclasses.replace(ARCH, intermediate_size=5), 2)


def test_shards_reassemble_the_whole_model():
    recipe, full = numbered_recipe(), ARCH
    whole = {w.name: w.tensor for w in recipe.weights}
    ranks = [{w.name: w.tensor for w in rank_weights(recipe, 2, rank)} for rank in range(2)]
    q, kv = full.q_size, full.kv_size
    qkv = whole["layers.0.qkv.weight"]
    for rank, shard in enumerate(ranks):
        heads_q, heads_kv = slice(rank * q // 2, (rank + 1) * q // 2), slice(rank * kv // 2, (rank + 1) * kv // 2)
        expected = torch.cat([qkv[:q][heads_q], qkv[q:q + kv][heads_kv], qkv[q + kv:][heads_kv]])
        assert torch.equal(shard["layers.0.qkv.weight"], expected)
        assert torch.equal(shard["layers.0.o.bias"], whole["layers.0.o.bias"])  # added once, after the sum
        assert shard["vocab.start"].tolist() == [rank * 6]
    assert torch.equal(torch.cat([r["layers.0.o.weight"] for r in ranks], dim=1), whole["layers.0.o.weight"])
    assert torch.equal(torch.cat([r["layers.0.down.weight"] for r in ranks], dim=1), whole["layers.0.down.weight"])
    gate_up = whole["layers.0.gate_up.weight"]
    assert torch.equal(torch.cat([r["layers.0.gate_up.weight"][:3] for r in ranks]), gate_up[:6])
    assert torch.equal(torch.cat([r["layers.0.gate_up.weight"][3:] for r in ranks]), gate_up[6:])
    vocabulary = torch.cat([r["lm_head"] for r in ranks])
    assert torch.equal(vocabulary[:11], whole["lm_head"])
    assert not vocabulary[11:].any()  # the last rank's padding row


def test_weight_files_carry_catalogs_of_their_stored_tensors():
    files = rank_weight_files(numbered_recipe(), 2)
    assert [(f.rank, f.resource_id) for f in files] == [(0, "weights.rank0"), (1, "weights.rank1")]
    for file in files:
        data = file.image.to_bytes()
        tensors = load_safetensors(data)
        assert file.catalog.rank == file.rank and file.catalog.resource_id == file.resource_id
        assert {view.name for view in file.catalog.tensors} == set(tensors)
        for view in file.catalog.tensors:
            stored = tensors[view.name]
            assert view.shape == tuple(stored.shape)
            assert view.dtype == (mpb.DTYPE_INT64 if view.name == "w.vocab.start" else mpb.DTYPE_FLOAT32)
            raw = data[view.byte_offset:view.byte_offset + view.nbytes]
            assert raw == stored.contiguous().view(torch.uint8).reshape(-1).numpy().tobytes()


def test_weights_are_cut_into_parts_of_whole_tensors_in_name_order():
    """Parts of at most part_nbytes (a bigger tensor alone); every rank gets the same parts, and
    weight_resources names each slot's part on rank 0."""
    files = rank_weight_files(numbered_recipe(), 2, part_nbytes=200)
    per_rank = [[f for f in files if f.rank == rank] for rank in range(2)]
    assert len(per_rank[0]) == len(per_rank[1]) > 2
    assert [f.resource_id for f in per_rank[1]] == ["weights.rank1"] + [
        f"weights.rank1.part{k}" for k in range(1, len(per_rank[1]))]
    names = [view.name for f in per_rank[0] for view in sorted(f.catalog.tensors, key=lambda v: v.name)]
    assert names == sorted(names) and len(names) == len(set(names))  # name order, each tensor once
    for file in per_rank[0]:
        sizes = [view.nbytes for view in file.catalog.tensors]
        assert sum(sizes) <= 200 or len(sizes) == 1
    slots = weight_resources(files)
    assert slots == {view.name[2:]: f.resource_id for f in per_rank[0] for view in f.catalog.tensors}
    whole = rank_weight_files(numbered_recipe(), 2)  # the default size: one resource per rank
    assert [(f.rank, f.resource_id) for f in whole] == [(0, "weights.rank0"), (1, "weights.rank1")]


def test_weight_parts_keep_every_tensor_once():
    tensors = {name: torch.zeros(n, dtype=torch.uint8) for name, n in (("b", 60), ("a", 50), ("c", 300), ("d", 10))}
    parts = weight_parts(tensors, 100)
    assert [list(p) for p in parts] == [["a"], ["b"], ["c"], ["d"]]
    assert [list(p) for p in weight_parts(tensors, 1 << 20)] == [["a", "b", "c", "d"]]
    assert weight_parts({}, 100) == [{}]


HYBRID = dataclasses.replace(ARCH, num_layers=2, layer_windows=(0, 0), recurrent=RecurrentGeometry(
    layers=(0,), num_heads=4, head_dim=2, state_size=3, num_groups=2, conv_kernel=3, proj_bias=True, out_bias=True))


def test_mixers_split_by_heads_and_the_groups_they_read():
    recipe, g = numbered_recipe(HYBRID), HYBRID.recurrent
    whole = {w.name: w.tensor for w in recipe.weights}
    ranks = [{w.name: w.tensor for w in rank_weights(recipe, 2, rank)} for rank in range(2)]
    shard = rank_architecture(HYBRID, 2).recurrent
    assert (shard.num_heads, shard.num_groups, shard.conv_dim) == (2, 1, g.conv_dim // 2)
    inner, group = g.intermediate, g.state_size  # 8 channels of x (and z), 3 of each B and C group
    in_proj, conv = whole["layers.0.mixer.in_proj.weight"], whole["layers.0.mixer.conv.weight"]
    for rank, weights in enumerate(ranks):
        heads, channels, groups = slice(2 * rank, 2 * rank + 2), slice(4 * rank, 4 * rank + 4), slice(
            group * rank, group * (rank + 1))
        x, b, c = conv[:inner], conv[inner:inner + 2 * group], conv[inner + 2 * group:]
        assert torch.equal(weights["layers.0.mixer.conv.weight"], torch.cat([x[channels], b[groups], c[groups]]))
        z, xbc, dt = in_proj[:inner], in_proj[inner:inner + g.conv_dim], in_proj[inner + g.conv_dim:]
        x, b, c = xbc[:inner], xbc[inner:inner + 2 * group], xbc[inner + 2 * group:]
        expected = torch.cat([z[channels], x[channels], b[groups], c[groups], dt[heads]])
        assert torch.equal(weights["layers.0.mixer.in_proj.weight"], expected)
        for name in ("A", "D", "dt_bias"):
            assert torch.equal(weights[f"layers.0.mixer.{name}"], whole[f"layers.0.mixer.{name}"][heads])
        assert torch.equal(weights["layers.0.mixer.norm"], whole["layers.0.mixer.norm"][channels])
        assert torch.equal(weights["layers.0.mixer.out.bias"], whole["layers.0.mixer.out.bias"])  # added once
    out = torch.cat([r["layers.0.mixer.out.weight"] for r in ranks], dim=1)
    assert torch.equal(out, whole["layers.0.mixer.out.weight"])


def test_one_group_mixers_keep_b_and_c_whole_and_norm_over_the_ranks():
    one_group = dataclasses.replace(HYBRID, recurrent=dataclasses.replace(HYBRID.recurrent, num_groups=1))
    g, shard = one_group.recurrent, rank_architecture(one_group, 2).recurrent
    assert (shard.num_heads, shard.num_groups, shard.norm_ranks) == (2, 1, 2)
    recipe = numbered_recipe(one_group)
    conv = {w.name: w.tensor for w in recipe.weights}["layers.0.mixer.conv.weight"]
    for rank in range(2):
        weights = {w.name: w.tensor for w in rank_weights(recipe, 2, rank)}
        channels = slice(4 * rank, 4 * rank + 4)
        expected = torch.cat([conv[:g.intermediate][channels], conv[g.intermediate:]])  # x share, B and C whole
        assert torch.equal(weights["layers.0.mixer.conv.weight"], expected)


def test_mixer_groups_that_do_not_divide_are_refused_by_name():
    three_groups = dataclasses.replace(HYBRID, recurrent=dataclasses.replace(HYBRID.recurrent, num_heads=6,
                                                                               num_groups=3))
    with pytest.raises(CheckpointError, match="mixer groups"):
        rank_architecture(three_groups, 2)
