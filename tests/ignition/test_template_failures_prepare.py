"""A chat template that fails on the probe conversations through one of jinja's own pieces stops
prepare with a CheckpointError naming what the template cannot render, as a `raise_exception` does;
these escaped prepare as a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helios.ignition.architecture import CheckpointError
from helios.ignition.checkpoint_assets import read_assets
from support.chat_checkpoint import VOCAB_SIZE, write_frontend_files


@pytest.mark.parametrize("failing, error", [
    ("{{ 'x'.encode('no-such-codec') }}", "LookupError"),
    ("{{ 'xyz' | truncate(1) }}", "AssertionError"),
    ("{{ cycler().next() }}", "RuntimeError"),
    ("{{ 1e400 | int }}", "NameError"),
])
def test_a_template_failing_in_jinja_s_own_code_is_a_checkpoint_error(tmp_path: Path, failing, error):
    write_frontend_files(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": failing}))
    with pytest.raises(CheckpointError, match=f"cannot render a single user message: {error}"):
        read_assets(tmp_path, VOCAB_SIZE)
