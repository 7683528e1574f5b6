"""Prepare records the tool-call id length a checkpoint's template requires (needs the
checkpoint_assets.py wiring: `tool_call_id_len(probe)` into the FrontendDeclaration)."""

from __future__ import annotations

import json

import pytest

from helios.ignition.checkpoint_assets import read_assets
from support.family_checkpoints import CASES, MISTRAL_TOKENS, TEMPLATES, train_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(MISTRAL_TOKENS)


@pytest.mark.parametrize("name, expected", [("mistral", 9), ("llama3", 0), ("glm-4.5", 0)])
def test_prepare_records_the_id_length_the_template_requires(tmp_path, tokenizer, name, expected):
    case = next(case for case in CASES if case.name == name)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    settings = {"chat_template": (TEMPLATES / case.template).read_text(), "bos_token": "<s>", "eos_token": "</s>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(settings))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": case.model_type}))
    assert read_assets(tmp_path, tokenizer.get_vocab_size(), {"family": name}).frontend.tool_call_id_len == expected
