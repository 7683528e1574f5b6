"""A tiny training run twice with one seed gives byte-identical weights; another seed does not."""

from __future__ import annotations

import pytest
import torch
import train_default_model as training


@pytest.fixture()
def restore_torch_state():
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)


def _tiny(seed: int, out) -> training.TrainConfig:
    return training.TrainConfig(
        seed=seed, conversations=64, tokenizer_conversations=64, vocab_size=320, hidden_size=32,
        intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1, batch_size=8, warmup_steps=2,
        heldout_per_kind=0, out=str(out),
    )


def test_same_seed_same_weights_hash(tmp_path, restore_torch_state):
    first = training.run(_tiny(0, tmp_path / "a"))
    second = training.run(_tiny(0, tmp_path / "b"))
    other = training.run(_tiny(1, tmp_path / "c"))
    assert first == second
    assert other != first
    for name in ("tokenizer.json", "config.json", "tokenizer_config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
