"""The embedded default model: a small chat model trained by `training/train_default_model.py`.

The checkpoint directory (`default_model/`, Hugging Face layout: config.json, model.safetensors in
bfloat16, tokenizer.json, tokenizer_config.json with the chat template, chat_template.jinja,
generation_config.json, and training_run.json recording how it was made and what it scored) is
package data produced by that script; nothing here modifies it. The model's context is 512 tokens.
`default_tools()` returns the OpenAI-format tool declarations the model was trained to call
(`tools.json` beside this file, also the single source the training data is generated from).
`prepared.embedded_core()` prepares and signs the core `helios serve` runs when no model is given.
"""

from __future__ import annotations

import json
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent
_TOOLS_FILE = _PACKAGE_DIR / "tools.json"


def default_model_dir() -> Path:
    """The directory of the shipped checkpoint (read-only package data)."""
    return _PACKAGE_DIR / "default_model"


def default_tools() -> list[dict]:
    """The declared tools in OpenAI `tools` request format; a fresh copy on every call."""
    return json.loads(_TOOLS_FILE.read_text(encoding="utf-8"))


def default_tool_names() -> tuple[str, ...]:
    """The names of the declared tools, in declaration order."""
    return tuple(tool["function"]["name"] for tool in default_tools())
