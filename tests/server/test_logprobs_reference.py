"""Reported log-probabilities against `transformers`' float32 forward on the same weights, over the
official `openai` client (in-process app), for one core of each architecture: dense, MoE, DeepSeek
latent attention, gpt-oss (sinks, sliding windows), Mistral (sliding window) and the Bamba hybrid.

README (`logprobs`, `logit_bias`) documents the values as the distribution a token was drawn from
after penalties, the logit bias and the grammar mask, before temperature and the top-k/top-p/min-p
filters, so the reference is ``log_softmax`` of the raw logits (plus the request's bias or
penalties), whatever the temperature. Checked: the chosen token's value, the alternatives (0-20,
most probable first, the chosen token's value equal to its entry there), chat ``bytes`` (the
vocabulary's own bytes of each token), ``echo`` and vLLM's ``prompt_logprobs`` over prompts longer
than one prefill step and windows, streamed and not, n > 1, a second request over a cached prefix.
"""

from __future__ import annotations

import codecs
import math
from pathlib import Path

import openai
import pytest
import torch
import transformers
from tokenizers import Tokenizer

from helios.core.reader import open_core
from helios.runtime.service import RuntimeOptions, build_runtime
from helios.server.service import ServedModel
from support.server_core import NAMESPACE, SERVED_ID, openai_client
from support.sweeps import swept

TOLERANCE = 1e-4
PREFILL_TOKENS = 16
LONG_PROMPT = [(7 * i) % 290 + 6 for i in range(45)]  # three prefill steps, past every sliding window
USER = [{"role": "user", "content": "the weather in paris? caf\u00e9 \u65e5\u672c"}]  # split characters

_PREPARED: dict[str, Path] = {}


def _family(name: str):
    from ignition import hf_checkpoints

    return {"dense": hf_checkpoints.QWEN3, "moe": hf_checkpoints.QWEN3_MOE, "latent": hf_checkpoints.DEEPSEEK,
            "sinks": hf_checkpoints.GPT_OSS, "window": hf_checkpoints.MISTRAL, "hybrid": hf_checkpoints.BAMBA}[name]


SPECIAL_IDS = set(range(6))  # support.chat_checkpoint's special tokens: 0-5
# HELIOS_LOGPROBS_FAMILY_SWEEP=1 adds MoE, DeepSeek latent attention and Mistral's sliding window, and
# every presentation variant of a test on every family (`_variants`). By default the dense core covers
# the reporting path they share (every variant), gpt-oss (sinks) a windowed core, the hybrid a core
# without scored prefill; tests/ignition/test_equivalence checks each family's logits and scored
# log-probabilities against transformers.
SWEPT = ("moe", "latent", "window") if swept("HELIOS_LOGPROBS_FAMILY_SWEEP") else ()
SCORED = ("dense", "sinks", *SWEPT)  # a hybrid core has no scored-prefill program
ALL = SCORED + ("hybrid",)


def _variants(names: tuple, options: list, kept: list) -> list:
    """(name, *option) for each family and option of a test: every option on the dense core, the options in `kept`
    on the other families (their values take the path `kept` takes; how an option presents them, JSON or streamed,
    with how many alternatives, is the dense core's path too), every option on every family with
    HELIOS_LOGPROBS_FAMILY_SWEEP=1."""
    every = swept("HELIOS_LOGPROBS_FAMILY_SWEEP")
    return [(name, *option) for name in names for option in options if every or name == "dense" or option in kept]


def _prepared(name: str, base: Path) -> Path:
    """The core of family `name` (prepared once per process): token-logprobs programs, scored
    prefill where the architecture has it, 16-token prefill steps, decode batches of 4 (a lone request
    decodes in one of its rows, n = 3 in three), and
    mixed steps (prefill beside decoding rows) on the dense core, which is `support.server_core.scored_core`
    (the server tests' scored core, prepared once per run). The hybrid is test_hybrid_chat_turns' core (one
    decode batch of 2, 32-token prefill steps, token log-probabilities), prepared once per run too."""
    from helios.core.keys import SigningKey, write_key_pair
    from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core
    from support.chat_checkpoint import write_chat_checkpoint
    from support.server_core import scored_core

    if name == "dense":
        return scored_core(base).path.parent
    if name == "hybrid":
        from server.test_hybrid_chat_turns import hybrid_chat_core

        return hybrid_chat_core(base)
    if name not in _PREPARED:
        root = base / f"logprobs-{name}"
        root.mkdir(parents=True, exist_ok=True)
        key = SigningKey.generate()
        write_key_pair(root / "publisher.key", key, [NAMESPACE])
        write_chat_checkpoint(_family(name), root / "checkpoint", seed=3)
        plan = CapacityPlan(context_tokens=128, prefill_tokens=PREFILL_TOKENS, decode_batches=(4,), mixed=False,
                            scored_prefill=name in SCORED)
        prepare_core(root / "checkpoint", root / "model.core", key,
                     PrepareOptions(NAMESPACE, served_id=SERVED_ID, capacities=plan))
        _PREPARED[name] = root
    return _PREPARED[name]


class Reference:
    """`transformers`' float32 model of a prepared checkpoint: ``table(ids)`` is float64
    ``log_softmax`` of the logits after every prefix of `ids` (row i scores ids[i + 1]), with
    `bias` ({id: value}) added to the logits first."""

    def __init__(self, checkpoint: Path):
        from support.bamba_reference import grouped_gated_norm

        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            str(checkpoint), attn_implementation="eager").float().eval()
        grouped_gated_norm(self.model)

    def logits(self, ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return self.model(torch.tensor([ids])).logits[0].double()

    def table(self, ids: list[int], bias: dict[int, float] | None = None) -> torch.Tensor:
        logits = self.logits(ids)
        for token, value in (bias or {}).items():
            logits[:, token] += value
        return torch.log_softmax(logits, dim=-1)


class Family:
    """One served core, its reference and its tokenizer's texts and bytes."""

    def __init__(self, name: str, root: Path):
        from server.test_hybrid_chat_turns import NAMESPACE as HYBRID_NAMESPACE

        self.name = name
        accept = HYBRID_NAMESPACE if name == "hybrid" else NAMESPACE
        opened = open_core(root / "model.core", accept=accept, trusted_keys=[root / "publisher.key.pub"])
        self.served = ServedModel.from_runtime(build_runtime(opened, RuntimeOptions(queue_capacity=8)),
                                               queue_capacity=8, frontend_workers=2, owned_by=NAMESPACE)
        self.served.start()
        self.client = openai_client(self.served)
        self.reference = Reference(root / "checkpoint")
        self.tokenizer = Tokenizer.from_file(str(root / "checkpoint" / "tokenizer.json"))
        self._bytes = _byte_level_bytes(self.tokenizer)

    def text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def raw(self, token_id: int) -> bytes:
        return self._bytes[token_id]


def _byte_level_bytes(tokenizer) -> dict[int, bytes]:
    """Each id's bytes as the byte-level vocabulary spells them (GPT-2's byte-to-character map
    undone; a special token: its text's UTF-8)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    shifted = [b for b in range(256) if b not in printable]
    characters = {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(shifted)}
    special = {token.content for token in tokenizer.get_added_tokens_decoder().values()}
    spelled = {}
    for piece, token_id in tokenizer.get_vocab(with_added_tokens=True).items():
        spelled[token_id] = piece.encode() if piece in special else bytes(characters[c] for c in piece)
    return spelled


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    served: dict[str, Family] = {}

    def get(name: str) -> Family:
        if name not in served:
            served[name] = Family(name, _prepared(name, tmp_path_factory.getbasetemp()))
        return served[name]

    yield get
    for family in served.values():
        family.served.shutdown()


async def _collect(stream) -> list:
    return [chunk async for chunk in stream]


def _check_row(row: torch.Tensor, chosen_id: int, chosen: float, top: list[tuple[int, float]], num_top: int) -> None:
    """One token's reported value and alternatives (ids, values) against the reference row."""
    assert abs(chosen - row[chosen_id].item()) < TOLERANCE, (chosen, row[chosen_id].item())
    assert len(top) == num_top
    values = [value for _, value in top]
    assert values == sorted(values, reverse=True)  # most probable first
    expected = torch.topk(row, num_top)
    assert max((abs(v - e) for v, e in zip(values, expected.values.tolist())), default=0) < TOLERANCE
    # the ids: the reference's, except where two values lie within the tolerance (either order is right)
    for (token, value), expected_id in zip(top, expected.indices.tolist()):
        assert token == expected_id or abs(row[token].item() - value) < TOLERANCE
    for token, value in top:
        if token == chosen_id:
            assert value == chosen  # the chosen token's entry among the alternatives is its value


def _output_rows(family: Family, prompt_ids: list[int], output_ids: list[int], bias=None) -> torch.Tensor:
    """The reference rows that score each output token (row i: output_ids[i])."""
    return family.reference.table(list(prompt_ids) + list(output_ids), bias)[len(prompt_ids) - 1:]


def _ids_of(family: Family, items) -> list[int]:
    """The ids of chat logprob items, by their bytes (texts of split characters read alike)."""
    by_bytes: dict[bytes, list[int]] = {}
    for token_id, raw in family._bytes.items():
        by_bytes.setdefault(raw, []).append(token_id)
    return [by_bytes[bytes(item.bytes)] for item in items]


def _check_chat_items(family: Family, content, rows: torch.Tensor, output_ids: list[int], num_top: int) -> None:
    """Chat ``logprobs.content`` items of `output_ids` (an EOS after them unlisted): texts, bytes
    and values against the reference rows."""
    assert [item.bytes for item in content] == [list(family.raw(t)) for t in output_ids[: len(content)]]
    for position, item in enumerate(content):
        token_id = output_ids[position]
        assert item.token == family.text(token_id)
        top = []
        for alt, candidates in zip(item.top_logprobs, _ids_of(family, item.top_logprobs)):
            assert alt.token == family.text(candidates[0])
            # one id per byte string, except special tokens that spell the same text
            token = candidates[0] if len(candidates) == 1 else max(candidates, key=lambda t: rows[position][t].item())
            top.append((token, alt.logprob))
        _check_row(rows[position], token_id, item.logprob, top, num_top)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_equal_transformers(runner, families, name, stream):
    family = families(name)
    kwargs = dict(model=SERVED_ID, messages=USER, max_tokens=6, temperature=0)
    ids = runner.run(family.client.chat.completions.create(**kwargs, extra_body={"return_token_ids": True}))
    prompt_ids, output_ids = ids.model_extra["prompt_token_ids"], ids.choices[0].model_extra["token_ids"]
    response = runner.run(family.client.chat.completions.create(**kwargs, logprobs=True, top_logprobs=20,
                                                                stream=stream))
    if stream:
        chunks = [chunk for chunk in runner.run(_collect(response)) if chunk.choices]
        content = [item for chunk in chunks if chunk.choices[0].logprobs for item in chunk.choices[0].logprobs.content]
        text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
    else:
        content = response.choices[0].logprobs.content
        text = response.choices[0].message.content
    assert content
    if not set(output_ids[: len(content)]) & SPECIAL_IDS:  # no reasoning or tool markup: all is content
        assert b"".join(bytes(item.bytes) for item in content).decode(errors="replace") == text
    rows = _output_rows(family, prompt_ids, output_ids)
    for position, token_id in enumerate(output_ids[: len(content)]):
        assert token_id == int(rows[position].argmax())  # greedy
    _check_chat_items(family, content, rows, output_ids, 20)


def _check_text_entries(family: Family, logprobs, ids: list[int], rows: list, num_top: int) -> None:
    """A text completion's ``logprobs`` (its lists as dicts or objects) for tokens `ids`, token i
    scored by reference row `rows[i]` (None: the first prompt token, no value)."""
    tokens, chosen, tops = logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"]
    assert tokens == [family.text(t) for t in ids]
    assert len(chosen) == len(tops) == len(ids)
    for token_id, row, value, top in zip(ids, rows, chosen, tops):
        if row is None:
            assert value is None and top is None
            continue
        assert abs(value - row[token_id].item()) < TOLERANCE
        expected: dict[str, float] = {}
        best = torch.topk(row, num_top)
        for alt, alt_value in zip(best.indices.tolist(), best.values.tolist()):
            expected.setdefault(family.text(alt), alt_value)  # ids that read alike: the likelier one
        if len(expected) == num_top or min(best.values.tolist(), default=0) - row.sort(descending=True).values[
                num_top].item() > TOLERANCE:  # the set of texts is not decided by a near tie
            assert list(top) == list(expected)  # in order: most probable first
        assert all(abs(top[text] - row[_id_of(family, text, row)].item()) < TOLERANCE for text in top)
        if family.text(token_id) in top and token_id == _id_of(family, family.text(token_id), row):
            assert top[family.text(token_id)] == value


def _id_of(family: Family, text: str, row: torch.Tensor) -> int:
    """The likeliest id reading `text`."""
    candidates = [t for t in range(row.shape[0]) if family.text(t) == text]
    return max(candidates, key=lambda t: row[t].item())


def _plain(logprobs) -> dict | None:
    if logprobs is None:
        return None
    return {"tokens": logprobs.tokens, "token_logprobs": logprobs.token_logprobs,
            "top_logprobs": logprobs.top_logprobs, "text_offset": logprobs.text_offset}


def _joined(parts: list[dict]) -> dict:
    return {key: [v for part in parts for v in part[key]] for key in ("tokens", "token_logprobs", "top_logprobs",
                                                                         "text_offset")}


def _completion(runner, family: Family, stream: bool, **fields):
    """(text, logprobs as one dict, output ids, choice extras of the first chunk or the choice)."""
    extra = fields.pop("extra_body", {})
    response = runner.run(family.client.completions.create(model=SERVED_ID, stream=stream, **fields,
                                                           extra_body={"return_token_ids": True, **extra}))
    if not stream:
        choice = response.choices[0]
        return choice.text, _plain(choice.logprobs), choice.model_extra["token_ids"], choice.model_extra
    chunks = [c for c in runner.run(_collect(response)) if c.choices]
    logprobs = _joined([_plain(c.choices[0].logprobs) for c in chunks if c.choices[0].logprobs])
    ids = [t for c in chunks for t in (c.choices[0].model_extra.get("token_ids") or [])]
    return "".join(c.choices[0].text for c in chunks), logprobs, ids, chunks[0].choices[0].model_extra


@pytest.mark.parametrize(("name", "num_top", "stream"),
                         _variants(SCORED, [(0, False), (1, True), (5, False), (20, True)], kept=[(20, True)]))
def test_echo_with_logprobs_equals_transformers(runner, families, name, num_top, stream):
    family = families(name)
    text, logprobs, output_ids, _ = _completion(runner, family, stream, prompt=LONG_PROMPT, max_tokens=4,
                                                temperature=0, echo=True, logprobs=num_top)
    ids = LONG_PROMPT + output_ids
    table = family.reference.table(ids)
    _check_text_entries(family, logprobs, ids, [None, *table[:-1]], num_top)
    assert output_ids == [int(table[len(LONG_PROMPT) - 1 + i].argmax()) for i in range(len(output_ids))]
    assert logprobs["text_offset"] == _first_byte_offsets(family, ids)
    assert text == b"".join(family.raw(t) for t in ids).decode(errors="replace")


def _first_byte_offsets(family: Family, ids: list[int]) -> list[int]:
    """Where each token starts in the lossy UTF-8 decoding of the tokens' bytes, a character
    belonging to the token holding its first byte (each stray byte reads one U+FFFD)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    offsets, num_chars = [], 0
    for token_id in ids:
        offsets.append(num_chars + bool(decoder.getstate()[0]))
        num_chars += len(decoder.decode(family.raw(token_id)))
    return offsets


@pytest.mark.parametrize(("name", "stream"), _variants(SCORED, [(False,), (True,)], kept=[(True,)]))
def test_prompt_logprobs_equal_transformers_and_repeat_over_a_cached_prefix(runner, families, name, stream):
    family = families(name)
    _completion(runner, family, stream, prompt=LONG_PROMPT, max_tokens=1, temperature=0)  # cached, unscored
    bodies = []
    for _ in range(2):  # each finds the prompt in the prefix cache
        _, _, _, extra = _completion(runner, family, stream, prompt=LONG_PROMPT, max_tokens=2, temperature=0,
                                     extra_body={"prompt_logprobs": 3})
        bodies.append(extra["prompt_logprobs"])
    assert bodies[0] == bodies[1]
    table = family.reference.table(LONG_PROMPT)
    body = bodies[0]
    assert len(body) == len(LONG_PROMPT) and body[0] is None
    for i in range(1, len(LONG_PROMPT)):
        row, token = table[i - 1], LONG_PROMPT[i]
        assert abs(body[i][str(token)]["logprob"] - row[token].item()) < TOLERANCE
        best = torch.topk(row, 3).indices.tolist()
        assert {str(t) for t in best} | {str(token)} == set(body[i])
        for rank, alt in enumerate(best, 1):
            assert body[i][str(alt)]["rank"] == rank and body[i][str(alt)]["decoded_token"] == family.text(alt)
            assert abs(body[i][str(alt)]["logprob"] - row[alt].item()) < TOLERANCE


@pytest.mark.parametrize("name", ALL)
def test_output_logprobs_after_a_cached_prefix_equal_transformers(runner, families, name):
    family = families(name)
    prefix = LONG_PROMPT[:40]
    before = family.served.stats().prefix_reused_tokens
    results = [(prompt, _completion(runner, family, False, prompt=prompt, max_tokens=3, temperature=0, logprobs=5))
               for prompt in (prefix, prefix + [11, 12])]
    assert family.served.stats().prefix_reused_tokens > before  # the second prompt reused the first's pages
    for prompt, (_, logprobs, output_ids, _) in results:
        table = family.reference.table(prompt + output_ids)
        listed = output_ids[: len(logprobs["tokens"])]  # an EOS ends the output unlisted
        assert listed and len(output_ids) - len(listed) <= 1
        _check_text_entries(family, logprobs, listed, list(table[len(prompt) - 1:]), 5)


def _chat(runner, family: Family, stream: bool, **fields):
    """Each choice's (logprob items, output ids) and the prompt ids of a chat request."""
    extra = {"return_token_ids": True, **fields.pop("extra_body", {})}
    response = runner.run(family.client.chat.completions.create(
        model=SERVED_ID, messages=USER, logprobs=True, stream=stream, extra_body=extra, **fields))
    if not stream:
        ordered = sorted(response.choices, key=lambda c: c.index)
        prompt_ids = response.model_extra["prompt_token_ids"]
        return [(c.logprobs.content, c.model_extra["token_ids"]) for c in ordered], prompt_ids
    chunks = runner.run(_collect(response))
    choices: dict[int, tuple[list, list]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            items, ids = choices.setdefault(choice.index, ([], []))
            items.extend(choice.logprobs.content if choice.logprobs else [])
            ids.extend(choice.model_extra.get("token_ids") or [])
    prompt_ids = next(c.model_extra["prompt_token_ids"] for c in chunks if c.model_extra.get("prompt_token_ids"))
    return [choices[i] for i in sorted(choices)], prompt_ids


@pytest.mark.parametrize(("name", "stream"), _variants(ALL, [(False,), (True,)], kept=[(True,)]))
def test_sampled_choices_report_the_distribution_before_temperature(runner, families, name, stream):
    family = families(name)
    choices, prompt_ids = _chat(runner, family, stream, n=3, max_tokens=5, temperature=1.7, top_p=0.9, seed=11,
                                top_logprobs=4)
    assert len(choices) == 3
    for content, output_ids in choices:
        assert content and len(output_ids) - len(content) <= 1  # an EOS ends the output unlisted
        rows = _output_rows(family, prompt_ids, output_ids)
        _check_chat_items(family, content, rows, output_ids, 4)


def _byte_ff(family: Family) -> int:
    (token_id,) = (t for t, raw in family._bytes.items() if raw == b"\xff")
    return token_id


@pytest.mark.parametrize("name", ["dense", "hybrid"])
def test_logprobs_report_the_biased_distribution(runner, families, name):
    family = families(name)
    bias = {_byte_ff(family): 4.0, 7: -100.0, 40: 2.5}
    choices, prompt_ids = _chat(runner, family, False, max_tokens=5, temperature=0, top_logprobs=6,
                                logit_bias={str(t): v for t, v in bias.items()})
    ((content, output_ids),) = choices
    rows = _output_rows(family, prompt_ids, output_ids, bias)
    assert output_ids[: len(content)] == [int(rows[i].argmax()) for i in range(len(content))]
    _check_chat_items(family, content, rows, output_ids, 6)


@pytest.mark.parametrize("name", ["dense", "hybrid"])
def test_the_byte_ff_token_reports_its_own_byte(runner, families, name):
    """llguidance spells the lone byte 0xFF (its special-token marker) as nothing; the token's
    ``bytes`` are still [255] and its text U+FFFD, as an alternative and as the chosen token."""
    family = families(name)
    token_id = _byte_ff(family)
    choices, prompt_ids = _chat(runner, family, False, max_tokens=2, temperature=0, top_logprobs=3,
                                logit_bias={str(token_id): 100})
    ((content, output_ids),) = choices
    assert output_ids[:2] == [token_id, token_id]
    for item in content:
        assert item.token == "\ufffd" and item.bytes == [255]
        assert item.top_logprobs[0].bytes == [255] and item.top_logprobs[0].logprob == item.logprob
    rows = _output_rows(family, prompt_ids, output_ids, {token_id: 100.0})
    _check_chat_items(family, content, rows, output_ids, 3)


def test_an_echoed_byte_ff_token_counts_as_one_character(runner, families):
    family = families("dense")
    token_id = _byte_ff(family)
    text, logprobs, _, _ = _completion(runner, family, False, prompt=[40, token_id, 41], max_tokens=1,
                                       temperature=0, echo=True, logprobs=1)
    assert text.startswith(family.text(40) + "\ufffd" + family.text(41))
    assert logprobs["text_offset"][:4] == [0, len(family.text(40)), len(family.text(40)) + 1,
                                           len(family.text(40)) + 1 + len(family.text(41))]


@pytest.mark.parametrize("name", ALL)
def test_logprobs_report_the_penalized_distribution(runner, families, name):
    """Repetition (over prompt and output tokens), then frequency and presence penalties (over
    output tokens), as `helios.abi.sampling.apply_penalties` documents them."""
    family = families(name)
    choices, prompt_ids = _chat(runner, family, False, max_tokens=6, temperature=0, top_logprobs=3,
                                frequency_penalty=1.5, presence_penalty=0.5, extra_body={"repetition_penalty": 1.3})
    ((content, output_ids),) = choices
    logits = family.reference.logits(list(prompt_ids) + list(output_ids))[len(prompt_ids) - 1:]
    vocab = logits.shape[1]
    prompt_seen = torch.bincount(torch.tensor(prompt_ids), minlength=vocab) > 0
    rows = []
    for position in range(len(output_ids)):
        counts = torch.bincount(torch.tensor(output_ids[:position], dtype=torch.long), minlength=vocab).double()
        row = logits[position]
        row = torch.where(prompt_seen | (counts > 0), torch.where(row > 0, row / 1.3, row * 1.3), row)
        row = row - 1.5 * counts - 0.5 * (counts > 0).double()
        rows.append(torch.log_softmax(row, dim=-1))
    assert output_ids[: len(content)] == [int(rows[i].argmax()) for i in range(len(content))]
    _check_chat_items(family, content, torch.stack(rows), output_ids, 3)


@pytest.mark.parametrize("echo", [False, True])
def test_stray_bytes_count_one_character_each_in_text_offsets(runner, families, echo):
    """Prompt and output tokens of lone continuation bytes and a start byte cut short: each reads
    one U+FFFD of the text, so each starts one character after the one before."""
    family = families("dense")
    strays = [t for t, raw in family._bytes.items() if len(raw) == 1 and 0x80 <= raw[0] < 0xC0][:3]
    start = next(t for t, raw in family._bytes.items() if raw == b"\xc3")
    prompt = [40, *strays, start, 41]  # the start byte's character ends at the next token
    text, logprobs, output_ids, _ = _completion(runner, family, False, prompt=prompt, max_tokens=3, temperature=0,
                                                echo=echo, logprobs=1, logit_bias={str(strays[0]): 100})
    assert output_ids == [strays[0]] * 3
    ids = prompt + output_ids if echo else output_ids
    shown = b"".join(family.raw(t) for t in ids).decode(errors="replace")
    assert text == shown and logprobs["tokens"] == [family.text(t) for t in ids]
    assert logprobs["text_offset"] == _first_byte_offsets(family, ids)


def test_a_grammar_masks_the_reported_distribution_and_ties_keep_id_order(runner, families):
    """Under a JSON-schema grammar the values are ``log_softmax`` over the tokens the mask allows;
    the masked alternatives (all tied at the lowest value JSON can carry) follow in id order."""
    family = families("dense")
    schema = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"enum": ["yes", "no"]}}}
    choices, prompt_ids = _chat(runner, family, False, max_tokens=3, temperature=0, top_logprobs=20,
                                response_format=schema)
    ((content, output_ids),) = choices
    logits = family.reference.logits(list(prompt_ids) + list(output_ids))[len(prompt_ids) - 1:]
    for position, item in enumerate(content):
        ids = [candidates[0] for candidates in _ids_of(family, item.top_logprobs)]
        allowed = [t for t, alt in zip(ids, item.top_logprobs) if alt.logprob > -1e30]
        masked = [t for t, alt in zip(ids, item.top_logprobs) if alt.logprob <= -1e30]
        assert allowed and masked  # every allowed token is listed, then the masked ones
        assert masked == sorted(masked) and all(alt.logprob == -3.4028234663852886e38
                                                for alt in item.top_logprobs[len(allowed):])
        row = torch.full_like(logits[position], -math.inf)
        row[allowed] = torch.log_softmax(logits[position][allowed], dim=-1)
        assert output_ids[position] == int(row.argmax())
        listed = [(token, alt.logprob) for token, alt in zip(ids, item.top_logprobs)]
        _check_row(row, output_ids[position], item.logprob, listed[: len(allowed)], len(allowed))


@pytest.mark.parametrize("name", ALL)
def test_concurrent_requests_each_get_their_own_logprobs(runner, families, name):
    """Requests of different prompt lengths sent together share decode steps (on the dense core a
    prompt also prefills beside decoding rows, when it arrives after another's prefill); each
    one's values are its own prefix's."""
    import asyncio

    family = families(name)
    prompts = [LONG_PROMPT[:n] for n in (3, 19, 33)]

    async def together():
        return await asyncio.gather(*(family.client.completions.create(
            model=SERVED_ID, prompt=prompt, max_tokens=6, temperature=0, logprobs=3,
            extra_body={"return_token_ids": True}) for prompt in prompts))

    for prompt, response in zip(prompts, runner.run(together())):
        choice = response.choices[0]
        output_ids = choice.model_extra["token_ids"]
        listed = output_ids[: len(choice.logprobs.tokens)]
        assert listed and len(output_ids) - len(listed) <= 1
        table = family.reference.table(prompt + output_ids)
        _check_text_entries(family, _plain(choice.logprobs), listed, list(table[len(prompt) - 1:]), 3)


@pytest.mark.parametrize("fields", [{"echo": True, "logprobs": 1}, {"extra_body": {"prompt_logprobs": 1}}])
def test_the_hybrid_core_refuses_prompt_scores_naming_scored_prefill(runner, families, fields):
    family = families("hybrid")
    with pytest.raises(openai.BadRequestError, match="no scored-prefill program"):
        runner.run(family.client.completions.create(model=SERVED_ID, prompt=LONG_PROMPT[:5], max_tokens=1, **fields))
