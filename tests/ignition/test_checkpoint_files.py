"""Which files of a checkpoint directory prepare reads, and how much of them: the weights transformers
loads (``model.safetensors``, else the shards of its index, or the file config.json's ``transformers_weights``
names) and no other *.safetensors file beside them; a config or index no larger than `MAX_JSON_NBYTES`;
and the Engram table's headers checked against the memory available before its tensors are read, as
the weights' are.

Each checkpoint test starts from a copy of the tiny Qwen3 chat checkpoint (`checkpoint` in conftest)."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import helios.ignition.recipes.checkpoint as checkpoint_module
from helios.ignition.architecture import CheckpointError
from helios.ignition.engram import ENGRAM_FILE, PROJ, TABLE, EngramTableError, read_engram
from helios.ignition.recipes import load_checkpoint

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
SHARD = "model-00001-of-00001.safetensors"


def _sharded(directory: Path) -> dict[str, str]:
    """The weights moved into one shard, without an index yet: its weight map."""
    (directory / WEIGHTS).rename(directory / SHARD)
    return {name: SHARD for name in load_file(str(directory / SHARD))}


def _same_weights(directory: Path, pristine: Path) -> None:
    recipe, expected = load_checkpoint(directory), load_checkpoint(pristine)
    assert [weight.name for weight in recipe.weights] == [weight.name for weight in expected.weights]
    assert all(torch.equal(a.tensor, b.tensor) for a, b in zip(recipe.weights, expected.weights))


# --- which *.safetensors files ------------------------------------------------------------------

def test_a_copy_of_the_weights_beside_model_safetensors_is_not_read(checkpoint, pristine):
    # Without an index every *.safetensors file was read: a consolidated copy beside the weights was
    # refused as holding each tensor twice, where transformers reads model.safetensors alone.
    shutil.copy(checkpoint / WEIGHTS, checkpoint / "consolidated.safetensors")
    _same_weights(checkpoint, pristine)


def test_an_adapter_beside_model_safetensors_is_not_read(checkpoint, pristine):
    # Its tensors were taken as the model's (here refused as tensors the recipe does not place).
    save_file({"base_model.model.lm_head.lora_A.weight": torch.zeros(4, 64)}, str(checkpoint / "adapter.safetensors"))
    _same_weights(checkpoint, pristine)


def test_without_model_safetensors_or_an_index_other_safetensors_files_are_not_read(checkpoint):
    # transformers finds no weights there; the copy under another name was prepared as the model.
    (checkpoint / WEIGHTS).rename(checkpoint / "consolidated.safetensors")
    with pytest.raises(CheckpointError, match=f"has neither {WEIGHTS} nor {INDEX}"):
        load_checkpoint(checkpoint)


def test_model_safetensors_wins_over_an_index_beside_it_as_in_transformers(checkpoint, pristine):
    # from_pretrained reads model.safetensors where both are there and never opens the index; the
    # shards of a stale index (here other values, in another file) were prepared instead.
    names = load_file(str(checkpoint / WEIGHTS))
    save_file({name: tensor + 1 for name, tensor in names.items()}, str(checkpoint / SHARD))
    (checkpoint / INDEX).write_text(json.dumps({"weight_map": {name: SHARD for name in names}}))
    _same_weights(checkpoint, pristine)
    # Without model.safetensors the index's shards are the weights.
    (checkpoint / WEIGHTS).unlink()
    recipe = load_checkpoint(checkpoint)
    assert not torch.equal(recipe.weights[0].tensor, load_checkpoint(pristine).weights[0].tensor)


def _name_weights(directory: Path, value: object) -> None:
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "transformers_weights": value}))


@pytest.mark.parametrize("sharded", [False, True], ids=["file", "index"])
def test_the_weights_file_config_json_names_is_read_as_in_transformers(checkpoint, pristine, sharded):
    # transformers_weights names the weights where model.safetensors holds something else (another
    # library's weights); model.safetensors was read, here refused as tensors the recipe does not place.
    if sharded:
        (checkpoint / "hf.safetensors.index.json").write_text(json.dumps({"weight_map": _sharded(checkpoint)}))
    else:
        (checkpoint / WEIGHTS).rename(checkpoint / "hf.safetensors")
    save_file({"tok_embeddings.weight": torch.zeros(4, 64)}, str(checkpoint / WEIGHTS))
    _name_weights(checkpoint, "hf.safetensors.index.json" if sharded else "hf.safetensors")
    _same_weights(checkpoint, pristine)


@pytest.mark.parametrize("value, phrase", [
    ("../model.safetensors", "transformers_weights must name a \\*.safetensors or \\*.safetensors.index.json file "
                             "inside the checkpoint directory, got '../model.safetensors'"),
    ("pytorch_model.bin", "transformers_weights must name .* got 'pytorch_model.bin'"),
    (7, "transformers_weights must name .* got 7"),
    ("absent.safetensors", "has no absent.safetensors, which config.json's transformers_weights names"),
])
def test_a_weights_file_config_json_cannot_name_is_refused(checkpoint, value, phrase):
    _name_weights(checkpoint, value)
    with pytest.raises(CheckpointError, match=phrase):
        load_checkpoint(checkpoint)


def test_an_index_naming_no_tensors_is_refused_naming_it(checkpoint):
    # Only the shards it names are read: none, and the checkpoint was refused as holding no tensors.
    _sharded(checkpoint)
    (checkpoint / INDEX).write_text(json.dumps({"weight_map": {}}))
    with pytest.raises(CheckpointError, match=f"{INDEX}: its weight_map names no tensors"):
        load_checkpoint(checkpoint)


# --- the size of config.json and the index --------------------------------------------------------

@pytest.mark.parametrize("name", ["config.json", INDEX])
def test_a_json_file_past_the_bound_is_refused_naming_it(checkpoint, monkeypatch, name):
    # config.json and the index were read whole, however large (a sparse file of terabytes: all of it
    # in memory, then parsed). Valid JSON, padded past a bound lowered for the test, is refused too.
    if name == INDEX:
        (checkpoint / INDEX).write_text(json.dumps({"weight_map": _sharded(checkpoint)}))
    path = checkpoint / name
    path.write_text(path.read_text() + " " * 8192)
    monkeypatch.setattr(checkpoint_module, "MAX_JSON_NBYTES", 4096, raising=False)
    with pytest.raises(CheckpointError, match=f"{path} is larger than 4096 bytes"):
        load_checkpoint(checkpoint)


def test_json_files_within_the_bound_are_read(checkpoint, pristine):
    (checkpoint / INDEX).write_text(json.dumps({"weight_map": _sharded(checkpoint)}))
    _same_weights(checkpoint, pristine)


# --- the Engram table -------------------------------------------------------------------------------

def test_an_engram_table_a_sparse_file_claims_past_the_memory_available_is_refused_before_it_is_read(
        tmp_path, monkeypatch):
    """``engram.safetensors`` was read with `get_tensor` and no check: a table whose header claims more
    than the machine holds (its holes cover it, so safetensors' own checks pass) was read in full."""
    hidden, width, heads = 8, 4, 1
    proj = torch.ones(hidden, heads * width).numpy().tobytes()
    claimed = 64 << 20
    header = {"__metadata__": {"ngram_tokens": "1", "heads": str(heads), "multipliers": "3"},
              PROJ: {"dtype": "F32", "shape": [hidden, heads * width], "data_offsets": [0, len(proj)]},
              TABLE: {"dtype": "F32", "shape": [claimed // (4 * width), width],
                      "data_offsets": [len(proj), len(proj) + claimed]}}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path = tmp_path / ENGRAM_FILE
    path.write_bytes(struct.pack("<Q", len(text)) + text + proj)
    with open(path, "r+b") as handle:  # holes, not bytes: nothing is written to disk
        handle.truncate(os.path.getsize(path) + claimed)
    monkeypatch.setattr(checkpoint_module, "available_memory_nbytes", lambda: 8 << 20)
    with pytest.raises(EngramTableError) as raised:
        read_engram(tmp_path, hidden, "float32")
    assert f"tensor {TABLE} in {ENGRAM_FILE} is [{claimed // (4 * width)}, {width}] F32" in str(raised.value)
    assert "more than the 8388608 bytes of memory available" in str(raised.value)
