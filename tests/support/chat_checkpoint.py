"""A complete tiny chat checkpoint on disk: random weights of a recipe family plus a real
byte-level BPE tokenizer (trained here with `tokenizers`), special tokens and a chat template.

Used by end-to-end tests (prepare -> verify -> load -> generate -> serve).
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>")
VOCAB_SIZE = 320
# ChatML turns; assistant reasoning in think tags and tool calls in Qwen Coder function tags, so the
# template itself declares think-tag reasoning and function-tag tools (prepare reads both from it).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "<|im_start|>{{ message.role }}\n"
    "{%- if message.reasoning_content -%}<think>\n{{ message.reasoning_content }}\n</think>\n\n{%- endif -%}"
    "{{ message.content }}"
    "{%- for call in message.tool_calls or [] -%}"
    "<tool_call>\n<function={{ call.function.name }}>\n"
    "{%- for key, value in call.function.arguments.items() -%}"
    "<parameter={{ key }}>\n{{ value }}\n</parameter>\n"
    "{%- endfor -%}"
    "</function>\n</tool_call>"
    "{%- endfor -%}"
    "<|im_end|>\n"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)
_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, how are you today? I am fine, thanks.",
    "what is 12 plus 30? it is 42. numbers 0 1 2 3 4 5 6 7 8 9",
    "the weather in paris is sunny; in london it rains.",
] * 20


def train_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_CORPUS, trainer)
    return tokenizer


def write_frontend_files(directory: Path) -> Tokenizer:
    """Writes tokenizer.json, tokenizer_config.json and generation_config.json into `directory`."""
    tokenizer = train_tokenizer()
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"chat_template": CHAT_TEMPLATE, "eos_token": "<|im_end|>", "bos_token": None}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    eos = tokenizer.token_to_id("<|im_end|>")
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return tokenizer


def write_chat_checkpoint(family, directory: Path, seed: int = 0) -> Path:
    """Random `family` weights with the tokenizer's vocabulary size, plus the frontend files."""
    from ignition.hf_checkpoints import random_model, write_checkpoint

    sized = type(family)(family.name, family.config_class, family.overrides + (("vocab_size", VOCAB_SIZE),))
    directory.mkdir(parents=True, exist_ok=True)
    write_checkpoint(random_model(sized, seed), directory)
    write_frontend_files(directory)
    return directory
