"""Small byte-level BPE tokenizers, trained here with `tokenizers`, for syntaxes that no packaged
tokenizer covers (XTML, recipient headers). Session-scoped and read-only."""

from __future__ import annotations

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

CORPUS = [
    "The weather in Paris is mild today, and the user wants a forecast for three days.",
    "I should call the tool with the city name and the number of days; a < b && c > d.",
    "<xtml:think>reasoning</xtml:think> <xtml:calls> <xtml:call name=\"get_weather\">",
    "<xtml:arg name=\"city\">Paris</xtml:arg> </xtml:call> </xtml:calls> &lt; &gt; &amp;",
    "assistant to=self to=user to=commentary to=functions to=functions.get_weather",
    "<atem:function_calls> <atem:invoke name=\"get_weather\"> <atem:parameter name=\"days\">3",
    "</atem:parameter> </atem:invoke> </atem:function_calls> Voilà: 東京 🧪 naïve café",
]


def small_bpe(special: list[str]) -> Tokenizer:
    tokenizer = Tokenizer(BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.add_special_tokens([AddedToken(text, special=True, normalized=False) for text in special])
    return tokenizer


@pytest.fixture(scope="session")
def xtml_tokenizer() -> Tokenizer:
    """No XTML spelling is a single token: every XTML delimiter is recognised in the text."""
    return small_bpe(["<|endoftext|>"])


@pytest.fixture(scope="session")
def recipient_tokenizer() -> Tokenizer:
    return small_bpe(["<|endoftext|>", "<|start|>", "<|message|>", "<|eom|>"])


HARMONY_CONTROLS = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|constrain|>"]


@pytest.fixture(scope="session")
def harmony_tokenizer() -> Tokenizer:
    """The seven harmony controls as special tokens (gpt-oss's o200k_harmony spellings)."""
    return small_bpe(["<|endoftext|>", *HARMONY_CONTROLS])
