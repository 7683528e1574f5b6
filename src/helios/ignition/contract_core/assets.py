"""Tokenizer and chat template of a contract-driven core (`contract_core`).

The tokenizer is byte-level (ids 0-255 are the bytes) with every special token the contract names
at the id it declares: template tokens, EOS ids, the reasoning delimiters, the image feature id and
atomic spans; the assistant-boundary markers take the first free ids. The rest of the input range
is reserved specials. The template is a Llama-3-style role-header template over those markers.
"""

from __future__ import annotations

import json

from helios.contract import serving_pb2 as spb
from helios.ignition.contract_core.layout import ContractCoreError

BYTES = 256


def special_tokens(contract: spb.ServingContract) -> dict[int, str]:
    """id -> text of every special token."""
    model = contract.model
    named: dict[int, str] = {t.token_id: t.text for t in contract.defaults.template_tokens}
    syntax = model.frontend.reasoning_syntax
    if syntax.HasField("open_token_id"):
        named[syntax.open_token_id] = syntax.open
    if syntax.HasField("close_token_id"):
        named[syntax.close_token_id] = syntax.close
    layout = model.frontend.image_layout_data
    for token in layout.feature_ids:
        named.setdefault(token, "<|image|>")
    for i, span in enumerate(layout.atomic_spans):
        for j, token in enumerate(span.token_ids):
            named.setdefault(token, f"<|span_{i}_{j}|>")
    for token in contract.defaults.eos_token_ids:
        named.setdefault(token, f"<|eos_{token}|>")
    end = model.input_vocabulary.input.end
    if any(token < BYTES or token >= end for token in named):
        raise ContractCoreError("contract.defaults", f"special token ids must lie in [{BYTES}, {end})")
    free = (i for i in range(BYTES, end) if i not in named)
    boundary = model.frontend.assistant_boundary
    for text in (boundary.message_start, boundary.message_end, *_header_markers(boundary.assistant_header)):
        if text and text not in named.values():
            named[next(free)] = text
    for token in range(BYTES, end):
        named.setdefault(token, f"<|reserved_{token}|>")
    return named


def _header_markers(header: str) -> list[str]:
    """The special markers inside an assistant header (``<|...|>`` spans)."""
    out, start = [], header.find("<|")
    while start >= 0:
        end = header.find("|>", start)
        if end < 0:
            break
        out.append(header[start:end + 2])
        start = header.find("<|", end)
    return out


def tokenizer_json(contract: spb.ServingContract) -> bytes:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers import AddedToken
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()
    byte_map = _bytes_to_unicode()
    vocab = {byte_map[b]: b for b in range(BYTES)}
    assert set(vocab) == set(alphabet)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    specials = special_tokens(contract)
    tokenizer.add_special_tokens([AddedToken(specials[i], special=True, normalized=False)
                                  for i in sorted(specials)])
    data = json.loads(tokenizer.to_str())
    return json.dumps(data).encode("utf-8")


def _bytes_to_unicode() -> dict[int, str]:
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def chat_template(contract: spb.ServingContract) -> str:
    """Role headers between the assistant boundary's markers; an image content part renders the
    layout's atomic spans around one feature placeholder (FEATURE_SPAN: one span per image)."""
    boundary = contract.model.frontend.assistant_boundary
    specials = special_tokens(contract)
    layout = contract.model.frontend.image_layout_data
    image = ""
    if layout.feature_ids:
        spans = [specials[span.token_ids[0]] for span in layout.atomic_spans if span.token_ids]
        image = "".join((spans[0] if spans else "", specials[layout.feature_ids[0]], spans[1] if len(spans) > 1 else ""))
    bos = next((t.text for t in contract.defaults.template_tokens if t.name == "bos_token"), "")
    header = boundary.assistant_header
    role_end = header[len("assistant"):] if header.startswith("assistant") else header
    start, end = boundary.message_start, boundary.message_end
    content = ("{% if message['content'] is string %}{{ message['content'] }}{% else %}"
               "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
               f"{{% else %}}{image}{{% endif %}}{{% endfor %}}{{% endif %}}")
    return (f"{bos}{{% for message in messages %}}{start}{{{{ message['role'] }}}}{role_end}{content}{end}"
            f"{{% endfor %}}{{% if add_generation_prompt %}}{start}{header}{{% endif %}}")
