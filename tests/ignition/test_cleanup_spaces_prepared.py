"""Prepare reads ``clean_up_tokenization_spaces`` as transformers 5's ``decode`` applies it: true on a
tokenizer whose model is not BPE (BPE only with the ``..._for_bpe_even_though_it_will_corrupt_output``
override); absent is false. The verdict is checked against ``AutoTokenizer.from_pretrained(...).decode``
and recorded in the frontend contract (`read_assets` declares it)."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer

from helios.contract import serving_pb2 as spb
from helios.ignition.architecture import CheckpointError
from helios.ignition.frontend.tokenizer_files import cleans_up_spaces
from helios.ignition.preparation.contract import FrontendDeclaration, _frontend

TEXT = "Hello , world . I do n't know ! It 's fine ?"
FORCE = "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"


def _tokenizer(kind: str) -> Tokenizer:
    if kind == "bpe":
        tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "</s>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    else:
        tokenizer = Tokenizer(models.Unigram() if kind == "unigram" else models.WordLevel(unk_token="<unk>"))
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        trainer = (trainers.UnigramTrainer(vocab_size=60, special_tokens=["<unk>", "</s>"], unk_token="<unk>")
                   if kind == "unigram" else trainers.WordLevelTrainer(special_tokens=["<unk>", "</s>"]))
    tokenizer.train_from_iterator([TEXT] * 10, trainer)
    return tokenizer


CONFIGS = [{"clean_up_tokenization_spaces": True}, {"clean_up_tokenization_spaces": False}, {},
           {"clean_up_tokenization_spaces": True, FORCE: True}, {"clean_up_tokenization_spaces": None}]


@pytest.mark.parametrize("kind", ["bpe", "wordlevel", "unigram"])
@pytest.mark.parametrize("config", CONFIGS)
def test_the_verdict_is_what_transformers_decode_does(tmp_path, kind, config):
    tokenizer = _tokenizer(kind)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", "unk_token": "<unk>", **config}))
    ids = tokenizer.encode(TEXT).ids
    cleaned = AutoTokenizer.from_pretrained(tmp_path).decode(ids) != tokenizer.decode(ids)
    assert cleans_up_spaces(tokenizer, config) is cleaned


@pytest.mark.parametrize("key", ["clean_up_tokenization_spaces", FORCE])
@pytest.mark.parametrize("value", ["true", 1, [True]])
def test_a_value_that_is_not_a_boolean_names_its_key(key, value):
    with pytest.raises(CheckpointError, match=f"tokenizer_config.json: {key} must be true or false"):
        cleans_up_spaces(_tokenizer("wordlevel"), {key: value})


@pytest.mark.parametrize("declared", [True, False])
def test_the_contract_records_the_verdict(declared):
    target = spb.FrontendContract()
    _frontend(target, FrontendDeclaration(clean_up_tokenization_spaces=declared))
    assert target.clean_up_tokenization_spaces is declared


@pytest.mark.parametrize("config, cleans", [({"clean_up_tokenization_spaces": True, FORCE: True}, True),
                                            ({"clean_up_tokenization_spaces": True}, False), ({}, False)])
def test_prepare_reads_the_verdict_into_the_frontend(tmp_path, config, cleans):
    """`read_assets` (what prepare declares) carries the verdict into the frontend declaration."""
    from ignition.test_frontend_assets import CHATML, tokenizer as asset_tokenizer, write

    from helios.ignition.checkpoint_assets import read_assets

    tokenizer = asset_tokenizer.__wrapped__()
    write(tmp_path, tokenizer, {"tokenizer_config.json": {"chat_template": CHATML, "eos_token": "</s>", **config}})
    frontend = read_assets(tmp_path, tokenizer.get_vocab_size()).frontend
    assert frontend.clean_up_tokenization_spaces is cleans
