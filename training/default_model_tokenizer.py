"""The default model's byte-level BPE tokenizer and its Hugging Face tokenizer_config.json.

Pre-tokenization (`PRE_TOKEN_PATTERN`, then the byte-level mapping without its own regex) is
GPT-2's split with two changes a small model needs:
  - every digit is its own pre-token, so no merge joins digits (arithmetic stays digit by digit);
  - a space is not glued to a word that starts with a capital letter, so names, cities and codes
    are the same tokens after a space, a newline or a quote: copying `Tokyo` from "weather in
    Tokyo?" into a tool call's `<parameter=city>\nTokyo\n` or a JSON string is plain copying, not
    a learned spelling. Lower-case words keep their leading space as in GPT-2, so ordinary prose
    stays short and "what followed this token" stays unambiguous for copying.
The special tokens take ids 0..8 in `SPECIAL_TOKENS` order. Training is deterministic for a fixed
input order: the BPE trainer breaks count ties by pair ids, and the byte alphabet is assigned ids
in sorted order.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = (
    "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
    "<tool_response>", "</tool_response>", "<|pad|>",
)
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|pad|>"
MAX_LENGTH = 512
PRE_TOKEN_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{Ll}\p{L}*|\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A BPE of `vocab_size` entries (specials and the 256 byte symbols included) over `texts`."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRE_TOKEN_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def special_token_ids(tokenizer: Tokenizer) -> dict[str, int]:
    return {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}


def tokenizer_config(tokenizer: Tokenizer, chat_template: str) -> dict:
    """The tokenizer_config.json contents: EOS `<|im_end|>`, pad `<|pad|>`, no BOS, the template."""
    decoder = {
        str(tokenizer.token_to_id(token)): {
            "content": token, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": True,
        }
        for token in SPECIAL_TOKENS
    }
    return {
        "add_bos_token": False,
        "add_eos_token": False,
        "added_tokens_decoder": decoder,
        "bos_token": None,
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS_TOKEN,
        "model_max_length": MAX_LENGTH,
        "pad_token": PAD_TOKEN,
        "padding_side": "left",
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }
