"""What a checkpoint's tokenizer and generation files declare, read as `transformers` reads them.

- `chat_template`: the template `AutoTokenizer` + ``apply_chat_template`` render. Template files win
  over ``tokenizer_config.json``'s ``chat_template`` (a string, or a list of ``{"name", "template"}``):
  ``chat_template.jinja`` is the ``default`` template, ``additional_chat_templates/NAME.jinja`` the
  others.
  A ``tool_use`` template serves requests that declare tools and ``default`` the rest (transformers'
  `get_chat_template`); both then become one template that switches on ``tools``. A processor's
  ``chat_template.json`` is read when the tokenizer declares none (vision-language checkpoints).
- `special_tokens`: the named special tokens a template sees (``bos_token``, ``eos_token``, ...,
  and a model's own ``*_token`` strings), from ``tokenizer_config.json`` (strings or AddedToken
  objects) or, in the legacy layout without ``added_tokens_decoder``, ``special_tokens_map.json``
  over it.
- `eos_token_ids`: ``generation_config.json``'s ``eos_token_id`` (``config.json``'s where the
  generation config gives none, as transformers' ``GenerationConfig`` falls back) plus the
  tokenizer's ``eos_token``.
- `parsed_tokenizer` / `served_tokenizer`: tokenizer.json as transformers encodes with it: the
  ``padding`` and ``truncation`` it may hold are dropped (a call to a transformers tokenizer pads and
  truncates only when asked; the served tokenizer would have cut or padded every prompt), and it
  must encode text of several scripts into ids inside the vocabulary (a WordPiece or Unigram model
  without its unknown token fails on the first character it lacks; a post-processor may add ids
  past the embedding).
- `cleans_up_spaces`: whether transformers' ``decode`` cleans up tokenization spaces (" ." -> "."):
  ``clean_up_tokenization_spaces`` true (absent: false, transformers 5's default), on a tokenizer whose
  model is not BPE (transformers 5 skips the cleanup for BPE, as it corrupts such text, unless
  ``clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output`` is true too).

A value of the wrong shape stops prepare with a `CheckpointError` naming the file and key.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Mapping

from tokenizers import Tokenizer

from helios.contract import serving_pb2 as spb
from helios.ignition.architecture import CheckpointError
from helios.ignition.recipes.checkpoint import MAX_JSON_NBYTES

TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP = "tokenizer_config.json", "special_tokens_map.json"
TEMPLATE_FILE, TEMPLATE_DIR, PROCESSOR_TEMPLATE = "chat_template.jinja", "additional_chat_templates", "chat_template.json"
GENERATION_CONFIG, MODEL_CONFIG = "generation_config.json", "config.json"
# transformers' SPECIAL_TOKENS_ATTRIBUTES: the names apply_chat_template passes to every template.
NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# Jinja drops one trailing newline of a template's source; a template inside another would keep it.
_TRAILING_NEWLINE = re.compile(r"(\r\n|\r|\n)\Z")
# `{%+` keeps the whitespace ahead of a tag (no lstrip_blocks); the newline after each tag is the one
# trim_blocks removes, so each template starts at a line start, as it does alone.
_TOOLS_SWITCH = ("{%+ if tools is defined and tools is not none %}\n", "{%+ else %}\n", "{%+ endif %}")


# Text of several scripts, digits, punctuation, an emoji and white space: what served prompts hold.
SAMPLE_TEXT = "Hello, world! 0123 \u00fcn\u00efc\u00f6d\u00e9 \u6f22\u5b57 \u0645\u0631\u062d\u0628\u0627 \U0001f642\n\t"


def parsed_tokenizer(text: str, what: str) -> Tokenizer:
    """The tokenizer `text` describes; a `CheckpointError` starting with `what` where tokenizers refuses
    it, with its bare Exception or with a Rust panic (a corrupt normalizer's charsmap), which pyo3
    raises as a BaseException that no ``except Exception`` catches."""
    try:
        return Tokenizer.from_str(text)
    except BaseException as error:
        if not _is_tokenizers_error(error):
            raise
        raise CheckpointError(f"{what}: {error}") from None


def _is_tokenizers_error(error: BaseException) -> bool:
    """tokenizers' bare Exception, or a Rust panic, raised as pyo3's PanicException (a BaseException);
    not Ctrl-C or SIGTERM's `Terminated`."""
    return isinstance(error, Exception) or type(error).__name__ == "PanicException"


def served_tokenizer(tokenizer_json: bytes, tokenizer: Tokenizer, path: Path) -> tuple[bytes, Tokenizer]:
    """tokenizer.json without its ``padding`` and ``truncation`` settings (see the module docstring);
    the files unchanged when it has neither."""
    if tokenizer.padding is None and tokenizer.truncation is None:
        return tokenizer_json, tokenizer
    data = json.loads(tokenizer_json)  # tokenizers has just read it
    data["padding"] = data["truncation"] = None
    text = json.dumps(data, ensure_ascii=False)
    return text.encode("utf-8"), parsed_tokenizer(text, f"cannot read {path}")


def check_encodes(tokenizer: Tokenizer, path: Path, vocab_size: int) -> None:
    """`SAMPLE_TEXT` encodes, special tokens added as a completion prompt adds them, into ids the
    embedding holds; else a `CheckpointError` naming `path`."""
    try:
        ids = tokenizer.encode(SAMPLE_TEXT, add_special_tokens=True).ids
    except BaseException as error:
        if not _is_tokenizers_error(error):
            raise
        raise CheckpointError(f"{path} cannot encode text such as {SAMPLE_TEXT!r}: {error}") from None
    past = [token_id for token_id in ids if token_id >= vocab_size]
    if past:
        raise CheckpointError(f"{path} encodes text such as {SAMPLE_TEXT!r} to the id {past[0]}, past the model's "
                              f"vocab_size {vocab_size}: it has no embedding")


def read_bounded(path: Path, max_nbytes: int) -> bytes:
    """The bytes of the regular file `path`, refused having read no more than `max_nbytes` where it
    holds more (its size as read, not as stat reports it): a damaged or sparse file of gigabytes was
    read whole, then parsed. OSError where it cannot be read."""
    with path.open("rb") as handle:
        data = handle.read(max_nbytes + 1)
    if len(data) > max_nbytes:
        raise CheckpointError(f"{path} is larger than {max_nbytes} bytes, more than any such file of a checkpoint "
                              f"holds (a damaged or sparse file?)")
    return data


def read_json(path: Path) -> dict:
    """The JSON object in `path` ({} when there is no such file), of at most `MAX_JSON_NBYTES` (the
    bound of config.json and the shard index)."""
    if not path.exists():
        return {}
    if not path.is_file():  # a FIFO would block the read; read as absent, it was misnamed as missing
        raise CheckpointError(f"{path} is not a regular file")
    try:
        value = json.loads(read_bounded(path, MAX_JSON_NBYTES).decode("utf-8"))
    except (OSError, ValueError, RecursionError) as error:
        raise CheckpointError(f"cannot read {path}: {error}") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path} must hold a JSON object, not {type(value).__name__}")
    return value


def chat_template(directory: Path, tokenizer_config: Mapping[str, object]) -> str:
    """The chat template source to serve (see the module docstring)."""
    where, templates = _template_files(directory)
    if not templates and tokenizer_config.get("chat_template") is not None:
        where, templates = f"{TOKENIZER_CONFIG}: chat_template", _named(tokenizer_config["chat_template"], TOKENIZER_CONFIG)
    if not templates:
        processor = read_json(directory / PROCESSOR_TEMPLATE)
        if processor.get("chat_template") is not None:
            where, templates = f"{PROCESSOR_TEMPLATE}: chat_template", _named(processor["chat_template"], PROCESSOR_TEMPLATE)
    if not templates:
        raise CheckpointError(
            f"{directory} declares no chat template (no {TEMPLATE_FILE}, no chat_template in {TOKENIZER_CONFIG} "
            f"or {PROCESSOR_TEMPLATE}): a base model without one cannot serve chat; add the template to serve it")
    default = templates.get("default")
    if default is None:
        raise CheckpointError(f"{where} names templates {sorted(templates)} but none 'default', which "
                              f"apply_chat_template renders for requests without tools")
    tool_use = templates.get("tool_use")
    if tool_use is None or tool_use == default:
        return default
    return tools_switch(tool_use, default)


def tools_switch(tool_use: str, default: str) -> str:
    """One template that renders as `tool_use` where a request declares tools and as `default` elsewhere."""
    when_tools, otherwise, end = _TOOLS_SWITCH
    return when_tools + _TRAILING_NEWLINE.sub("", tool_use) + otherwise + _TRAILING_NEWLINE.sub("", default) + end


def _template_files(directory: Path) -> tuple[str, dict[str, str]]:
    files = [directory / TEMPLATE_FILE] if (directory / TEMPLATE_FILE).exists() else []
    if (directory / TEMPLATE_DIR).is_dir():
        files += sorted((directory / TEMPLATE_DIR).glob("*.jinja"))
    templates = {}
    for path in files:
        if not path.is_file():  # reading a FIFO would block forever
            raise CheckpointError(f"{path} is not a regular file")
        try:  # a template is kilobytes: the settings files' bound
            text = read_bounded(path, MAX_JSON_NBYTES).decode("utf-8")
        except (OSError, ValueError) as error:
            raise CheckpointError(f"cannot read {path}: {error}") from None
        templates["default" if path.name == TEMPLATE_FILE and path.parent == directory else path.stem] = text
    return f"{TEMPLATE_FILE} and {TEMPLATE_DIR}/", {name: text for name, text in templates.items() if text}


def _named(value: object, file: str) -> dict[str, str]:
    """name -> template of a ``chat_template`` value: a string, a list of {name, template}, or a mapping."""
    if isinstance(value, str):
        return {"default": value} if value else {}
    if isinstance(value, dict):
        value = [{"name": name, "template": template} for name, template in value.items()]
    if not isinstance(value, list):
        raise CheckpointError(f"{file}: chat_template must be a string or a list of {{name, template}} objects, "
                              f"not {type(value).__name__}")
    named = {}
    for i, entry in enumerate(value):
        name = entry.get("name") if isinstance(entry, dict) else None
        template = entry.get("template") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not isinstance(template, str):
            raise CheckpointError(f"{file}: chat_template[{i}] must be an object with a string name and template")
        named[name] = template
    return {name: template for name, template in named.items() if template}


def special_tokens(directory: Path, tokenizer_config: Mapping[str, object]) -> dict[str, str]:
    """Template variable -> token text of every named special token the files set."""
    values = {key: (TOKENIZER_CONFIG, value) for key, value in tokenizer_config.items()}
    if "added_tokens_decoder" not in tokenizer_config:  # the legacy layout, where transformers reads the map
        values.update((key, (SPECIAL_TOKENS_MAP, value)) for key, value in read_json(directory / SPECIAL_TOKENS_MAP).items())
    extra = values.get("extra_special_tokens", (None, None))
    if isinstance(extra[1], dict):  # a model's own named tokens ({"image_token": "<|image|>"})
        values.update((key, (extra[0], value)) for key, value in extra[1].items() if key not in values)
    tokens = {}
    for key, (file, value) in values.items():
        if key in NAMED_TOKENS:
            text = _token_text(value, file, key)
        elif key.endswith("_token") and key.isidentifier() and isinstance(value, str):
            text = value or None  # transformers keeps a model's own *_token strings as template variables
        else:
            continue
        if text is not None:
            tokens[key] = text
    return tokens


def _token_text(value: object, file: str, key: str) -> str | None:
    """The text of a string or AddedToken object ({"content": ..., "lstrip": ...}); None when unset."""
    if isinstance(value, dict):
        content = value.get("content")
        if not isinstance(content, str):
            raise CheckpointError(f"{file}: {key} is an object without a string content")
        value = content
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise CheckpointError(f"{file}: {key} must be a string or an AddedToken object, not {value!r}")
    return value


def cleans_up_spaces(tokenizer: Tokenizer, tokenizer_config: Mapping[str, object]) -> bool:
    """Whether transformers' ``decode`` applies ``clean_up_tokenization`` to this tokenizer's text
    (`TokenizersBackend._decode`; see the module docstring)."""
    cleans, even_bpe = (_flag(tokenizer_config, key) for key in (
        "clean_up_tokenization_spaces", "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"))
    return cleans and (even_bpe or type(tokenizer.model).__name__ != "BPE")


def _flag(tokenizer_config: Mapping[str, object], key: str) -> bool:
    """A true/false setting of ``tokenizer_config.json``; absent or null: false."""
    value = tokenizer_config.get(key)
    if value is not None and not isinstance(value, bool):
        raise CheckpointError(f"{TOKENIZER_CONFIG}: {key} must be true or false, not {value!r}")
    return bool(value)


def template_tokens(tokenizer: Tokenizer, named: Mapping[str, str], vocab_size: int) -> tuple[spb.TemplateToken, ...]:
    """The named tokens that are one token of the tokenizer inside the vocabulary (the contract's
    template tokens: the runtime checks each encodes as exactly its id)."""
    tokens = []
    for name, text in named.items():
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        if len(ids) == 1 and ids[0] == tokenizer.token_to_id(text) and ids[0] < vocab_size:
            tokens.append(spb.TemplateToken(name=name, text=text, token_id=ids[0]))
    return tuple(tokens)


def eos_token_ids(directory: Path, tokenizer: Tokenizer, named: Mapping[str, str], vocab_size: int) -> tuple[int, ...]:
    """The declared EOS ids inside the vocabulary, generation config first (see the module docstring)."""
    file, value = GENERATION_CONFIG, read_json(directory / GENERATION_CONFIG).get("eos_token_id")
    if value is None:
        model = read_json(directory / MODEL_CONFIG)
        text_config = model.get("text_config") if isinstance(model.get("text_config"), dict) else {}
        file, value = MODEL_CONFIG, model.get("eos_token_id", text_config.get("eos_token_id"))
    values = value if isinstance(value, list) else [] if value is None else [value]
    if any(isinstance(v, bool) or not isinstance(v, int) for v in values):
        raise CheckpointError(f"{file}: eos_token_id must be a token id or a list of token ids, not {value!r}")
    ids = list(values)
    text = named.get("eos_token")
    if text is not None and tokenizer.token_to_id(text) is not None:
        ids.append(tokenizer.token_to_id(text))
    unique = tuple(dict.fromkeys(i for i in ids if 0 <= i < vocab_size))
    if not unique:
        raise CheckpointError(f"{directory} declares no EOS token inside the vocabulary (eos_token_id in "
                              f"{GENERATION_CONFIG} or {MODEL_CONFIG}, eos_token in {TOKENIZER_CONFIG})")
    return unique


def missing_tokenizer_json(directory: Path) -> str:
    """The refusal for a checkpoint without tokenizer.json, naming what it has instead."""
    slow = [name for name in ("tokenizer.model", "vocab.json", "tiktoken.model") if (directory / name).is_file()]
    if not slow:
        return f"{directory} has no tokenizer.json"
    return (f"{directory} has no tokenizer.json, only {slow[0]} (a slow tokenizer's file): write tokenizer.json with "
            f"transformers (AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR), which needs sentencepiece "
            f"for tokenizer.model) and prepare again")


_ADDED_FLAGS = ("single_word", "lstrip", "rstrip", "normalized", "special")


def declared_added_tokens(tokenizer_json: bytes, tokenizer: Tokenizer,
                          tokenizer_config: Mapping[str, object]) -> tuple[bytes, Tokenizer]:
    """tokenizer.json with ``tokenizer_config.json``'s ``added_tokens_decoder`` applied as transformers
    applies it: a declared token becomes an added token at its id with the declared flags (``special``
    decides what a decode skips and what is a control marker). The files unchanged when they agree."""
    declared = tokenizer_config.get("added_tokens_decoder")
    if declared is None:
        return tokenizer_json, tokenizer
    if not isinstance(declared, dict):
        raise CheckpointError(f"{TOKENIZER_CONFIG}: added_tokens_decoder must map token ids to AddedToken objects")
    data = json.loads(tokenizer_json)
    added = {entry["id"]: entry for entry in data.get("added_tokens") or []}
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    next_id, changed = tokenizer.get_vocab_size(with_added_tokens=True), False
    # isdecimal, not isdigit: int() refuses digits such as "\u00b2" that isdigit accepts.
    for key, entry in sorted(declared.items(), key=lambda item: int(item[0]) if item[0].isdecimal() else -1):
        where = f"{TOKENIZER_CONFIG}: added_tokens_decoder[{key!r}]"
        content = entry.get("content") if isinstance(entry, dict) else None
        if not key.isdecimal() or not isinstance(content, str) or not content:
            raise CheckpointError(f"{where} must map a token id to an object with a non-empty string content")
        token_id, held = int(key), vocab.get(content)
        if held is None and token_id != next_id:
            raise CheckpointError(f"{where} declares {content!r}, which tokenizer.json does not hold, at id {token_id}, "
                                  f"not at the next free id {next_id}")
        if held is not None and held != token_id:
            raise CheckpointError(f"{where} declares {content!r}, which tokenizer.json holds as id {held}")
        flags = {name: entry[name] for name in _ADDED_FLAGS if isinstance(entry.get(name), bool)}
        special = flags.get("special", False)
        base = added.get(token_id) or {"id": token_id, "content": content, "single_word": False, "lstrip": False,
                                       "rstrip": False, "normalized": not special, "special": special}
        if {**base, **flags} != added.get(token_id):
            added[token_id], changed = {**base, **flags}, True
        next_id += held is None
    if not changed:
        return tokenizer_json, tokenizer
    data["added_tokens"] = [added[token_id] for token_id in sorted(added)]
    text = json.dumps(data, ensure_ascii=False)
    fitted = parsed_tokenizer(text, f"{TOKENIZER_CONFIG}: added_tokens_decoder does not fit tokenizer.json")
    return text.encode("utf-8"), fitted
