"""Hostile values `test_hostile_checkpoints` did not reach, each of which escaped as a traceback, a
hang or a core that could not serve: every one is now a `CheckpointError` naming the file and key
(or, for an out-of-range top_k, read as transformers reads it).

Each test starts from a copy of the tiny Qwen3 chat checkpoint (`checkpoint` in conftest)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helios.ignition.architecture import CheckpointError
from helios.ignition.checkpoint_assets import read_assets
from helios.ignition.frontend.sampling import recommended_sampling
from helios.ignition.recipes import load_checkpoint
from support.chat_checkpoint import VOCAB_SIZE


def _rewrite(path: Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_an_added_token_id_that_int_cannot_read_is_refused(checkpoint):
    # "²".isdigit() is true and int("²") raises: a ValueError traceback before.
    _rewrite(checkpoint / "tokenizer_config.json", added_tokens_decoder={"\u00b2": {"content": "<x>"}})
    with pytest.raises(CheckpointError, match="added_tokens_decoder\\['\u00b2'\\] must map a token id"):
        read_assets(checkpoint, VOCAB_SIZE)


def test_a_tokenizer_id_past_the_vocabulary_is_refused_though_the_count_fits(checkpoint):
    # 320 tokens fit vocab_size 320, but one of them has the id 100000: plain text encodes to it.
    path = checkpoint / "tokenizer.json"
    data = json.loads(path.read_text())
    token = next(text for text, token_id in data["model"]["vocab"].items() if token_id == 100)
    data["model"]["vocab"][token] = 100_000
    path.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=f"gives the token .* the id 100000, past the model's vocab_size "
                                              f"{VOCAB_SIZE}"):
        read_assets(checkpoint, VOCAB_SIZE)


@pytest.mark.timeout(60)
def test_an_additional_template_that_is_a_fifo_is_refused_not_waited_on(checkpoint):
    (checkpoint / "additional_chat_templates").mkdir()
    os.mkfifo(checkpoint / "additional_chat_templates" / "tool_use.jinja")  # reading it blocked forever
    with pytest.raises(CheckpointError, match="tool_use.jinja is not a regular file"):
        read_assets(checkpoint, VOCAB_SIZE)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"])
@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_an_optional_frontend_file_that_is_no_regular_file_is_named_not_read_as_absent(checkpoint, name, kind):
    # Read as absent before: a FIFO tokenizer_config.json was refused as "declares no chat template".
    path = checkpoint / name
    path.unlink(missing_ok=True)
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    with pytest.raises(CheckpointError, match=f"{name} is not a regular file"):
        read_assets(checkpoint, VOCAB_SIZE)


def test_a_nan_sampling_setting_is_refused_naming_the_file(checkpoint):
    # NaN passed the range check and failed contract validation after capture (exit 3, no file named).
    (checkpoint / "generation_config.json").write_text('{"eos_token_id": 1, "temperature": NaN}')
    with pytest.raises(CheckpointError, match="generation_config.json: temperature nan is outside"):
        recommended_sampling(checkpoint)


def test_a_top_k_past_32_bits_keeps_every_token(checkpoint):
    # The contract's top_k is a uint32: a ValueError traceback before.
    _rewrite(checkpoint / "generation_config.json", top_k=10**23)
    assert recommended_sampling(checkpoint).top_k == 2**31 - 1


@pytest.mark.parametrize("changes, phrase", [
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 10**30}}, "rope_parameters.rope_theta is an integer of"),
    ({"rms_norm_eps": 10**400}, "rms_norm_eps is an integer of 1329 bits"),
], ids=["int64 overflow in torch", "float overflow in the check"])
def test_a_float_setting_written_as_a_huge_integer_is_refused(checkpoint, changes, phrase):
    _rewrite(checkpoint / "config.json", **changes)
    with pytest.raises(CheckpointError, match=phrase):
        load_checkpoint(checkpoint)


def test_a_huge_integer_a_single_family_reads_is_a_checkpoint_error(tmp_path):
    from ignition.hf_checkpoints import GEMMA3, random_model, write_checkpoint

    directory = write_checkpoint(random_model(GEMMA3), tmp_path / "gemma3")
    _rewrite(directory / "config.json", query_pre_attn_scalar=10**400)  # float() overflows in the recipe
    with pytest.raises(CheckpointError, match="cannot prepare the Gemma3ForCausalLM checkpoint"):
        load_checkpoint(directory)
