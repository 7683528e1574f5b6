"""The tuned tile table of the expert kernels: keys, defaults, a written table read back, typed errors."""

from __future__ import annotations

import json

import pytest
import torch

from helios.abi.moe_tiles import (
    KernelTiles, LaunchTiles, TileTableError, default_tiles, load_table, shape_key, table_document, tiles_for,
)


def test_keys_bucket_assignments_to_powers_of_two():
    key = shape_key("grouped", 520, 128, 2048, 768, torch.bfloat16)
    assert key.text() == "grouped/A1024/E128/H2048/F768/bfloat16"
    assert shape_key("gemv", 8, 128, 2048, 768, torch.float32).assignments == 8
    with pytest.raises(TileTableError, match="unknown kernel path"):
        shape_key("dense", 8, 1, 1, 1, torch.float32)


def test_a_written_table_is_read_back_and_chosen_for_its_shape_only(tmp_path):
    tuned = LaunchTiles(KernelTiles(32, 128, 64, 8, 3), KernelTiles(32, 64, 128, 4, 4))
    key = shape_key("grouped", 512, 128, 2048, 768, torch.bfloat16)
    path = tmp_path / "tiles.json"
    path.write_text(json.dumps(table_document({key: tuned})))
    table = load_table(path)
    assert table == {key: tuned}
    assert tiles_for("grouped", 400, 128, 2048, 768, torch.bfloat16, table) == tuned  # same bucket
    other = tiles_for("grouped", 400, 64, 2048, 768, torch.bfloat16, table)
    assert other == default_tiles("grouped", 400, 64)


def test_a_missing_table_is_empty(tmp_path):
    assert load_table(tmp_path / "absent.json") == {}


@pytest.mark.parametrize("document,message", [
    ("[", "not JSON"),
    ('{"rows": {}}', "'entries' object"),
    ('{"entries": {"grouped/A8/E4/H8/F8": {}}}', "malformed"),
    ('{"entries": {"dense/A8/E4/H8/F8/float32": {"gate_up": {}, "down": {}}}}', "malformed"),
    ('{"entries": {"gemv/A8/E4/H8/F8/float32": {"gate_up": {"block_m": 1, "block_n": 24, "block_k": 32}, '
     '"down": {"block_m": 1, "block_n": 32, "block_k": 32}}}}', "block_n 24 is not a power of two"),
    ('{"entries": {"grouped/A64/E4/H8/F8/float32": {"gate_up": {"block_m": 16, "block_n": 32, "block_k": 32}, '
     '"down": {"block_m": 32, "block_n": 32, "block_k": 32}}}}', "one block_m"),
    ('{"entries": {"grouped/A64/E4/H8/F8/float32": {"gate_up": {"block_m": 16, "block_n": 8, "block_k": 32}, '
     '"down": {"block_m": 16, "block_n": 32, "block_k": 32}}}}', "at least 16"),
    ('{"entries": {"gemv/A8/E4/H8/F8/float32": {"gate_up": {"block_m": 1, "block_n": 32, "block_k": 32, '
     '"num_stages": 0}, "down": {"block_m": 1, "block_n": 32, "block_k": 32}}}}', "num_stages"),
])
def test_malformed_tables_raise_a_typed_error(tmp_path, document, message):
    path = tmp_path / "tiles.json"
    path.write_text(document)
    with pytest.raises(TileTableError, match=message):
        load_table(path)


def test_the_committed_table_loads():
    load_table()
