"""Writing the default model as a Hugging Face-layout checkpoint directory.

Files: config.json (LlamaForCausalLM, both `rope_theta` and `rope_parameters` so readers of either
transformers generation agree), generation_config.json (greedy defaults, EOS `<|im_end|>`),
model.safetensors (bfloat16, tied embeddings so no `lm_head.weight`), tokenizer.json,
tokenizer_config.json (with the chat template) and chat_template.jinja. Every file is written with
sorted keys and no version stamps, so equal inputs give byte-equal files.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer

from default_model_tokenizer import EOS_TOKEN, MAX_LENGTH, PAD_TOKEN, tokenizer_config

STORAGE_DTYPE = torch.bfloat16


def llama_config_dict(geometry: dict, tokenizer: Tokenizer) -> dict:
    """config.json for `geometry` (hidden_size, intermediate_size, num_hidden_layers,
    num_attention_heads, num_key_value_heads, vocab_size)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": None,
        "dtype": "bfloat16",
        "eos_token_id": tokenizer.token_to_id(EOS_TOKEN),
        "head_dim": geometry["hidden_size"] // geometry["num_attention_heads"],
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "max_position_embeddings": MAX_LENGTH,
        "mlp_bias": False,
        "model_type": "llama",
        "pad_token_id": tokenizer.token_to_id(PAD_TOKEN),
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        **geometry,
    }


def generation_config_dict(tokenizer: Tokenizer) -> dict:
    return {
        "do_sample": False,
        "eos_token_id": tokenizer.token_to_id(EOS_TOKEN),
        "max_new_tokens": 256,
        "pad_token_id": tokenizer.token_to_id(PAD_TOKEN),
    }


def weights_for_storage(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors as stored: bfloat16, contiguous, without the tied `lm_head.weight`."""
    return {
        name: tensor.detach().to(STORAGE_DTYPE).contiguous()
        for name, tensor in sorted(state_dict.items())
        if name != "lm_head.weight"
    }


def write_checkpoint(directory: Path, state_dict: dict, geometry: dict, tokenizer: Tokenizer, template: str) -> str:
    """Write every file of the checkpoint into `directory` (created if missing); returns the
    SHA-256 of model.safetensors."""
    directory.mkdir(parents=True, exist_ok=True)
    _write_json(directory / "config.json", llama_config_dict(geometry, tokenizer))
    _write_json(directory / "generation_config.json", generation_config_dict(tokenizer))
    _write_json(directory / "tokenizer_config.json", tokenizer_config(tokenizer, template))
    (directory / "tokenizer.json").write_text(tokenizer.to_str(pretty=True) + "\n", encoding="utf-8")
    (directory / "chat_template.jinja").write_text(template, encoding="utf-8")
    weights = directory / "model.safetensors"
    save_file(weights_for_storage(state_dict), str(weights), metadata={"format": "pt"})
    weights.chmod(0o644)  # safetensors creates the file owner-only; package data is world-readable
    return file_sha256(weights)


def write_record(directory: Path, config: dict, metrics: dict[str, float], runtime: dict[str, int]) -> None:
    """training_run.json: how the checkpoint was made and what it scored (provenance only; nothing
    reads it at serving time)."""
    record = {
        "command": "python training/train_default_model.py",
        "config": config,
        "heldout_accuracy": {group: round(value, 4) for group, value in metrics.items()},
        "model_sha256": file_sha256(directory / "model.safetensors"),
        "runtime": runtime,
        "tokenizer_sha256": file_sha256(directory / "tokenizer.json"),
    }
    _write_json(directory / "training_run.json", record)


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")
