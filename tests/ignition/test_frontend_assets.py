"""Frontend assets in the layouts Hugging Face checkpoints are published in, read by `read_assets`
as transformers reads the same files (AutoTokenizer + apply_chat_template, GenerationConfig), or
refused with one line naming the file and key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from helios.contract import serving_pb2 as spb
from helios.frontend.preparation.template import ChatTemplate
from helios.ignition.architecture import CheckpointError
from helios.ignition import checkpoint_assets
from helios.ignition.checkpoint_assets import read_assets
from helios.ignition.frontend import tokenizer_files
from helios.ignition.frontend.probes import PROBE_TOOLS, TOOL_NAME, tool_call_message, user
from helios.ignition.frontend.render import ProbeTemplate
from helios.ignition.frontend.sampling import merged_sampling, recommended_sampling

SPECIALS = ("<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>", "[INST]", "[/INST]", "<|image|>")
PLAIN_ADDED = "<plain>"  # an added token that is not special
CHATML = (
    "{%- for m in messages -%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)
# ChatML with the tools in a system turn and Hermes-style calls (what a tool_use template adds).
TOOL_USE = (
    "{%- if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif -%}"
    "{%- for m in messages -%}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{%- for call in m.tool_calls or [] -%}"
    '\n<tool_call>\n{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}\n</tool_call>'
    "{%- endfor -%}<|im_end|>\n{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}\n"
)
# Llama 2 / Mistral: the template writes the BOS itself; tokenizer.json's post-processor adds one too.
INST = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]"
        "{% else %}{{ m.content }}{{ eos_token }}{% endif %}{% endfor %}")
CONVERSATION = [user("hello world"), {"role": "assistant", "content": "how are you"}, user("hello")]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(["hello world, how are you? probe question one"] * 5, trainer)
    tokenizer.add_tokens([PLAIN_ADDED])
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tokenizer.token_to_id("<s>"))])
    return tokenizer


def write(directory: Path, tokenizer: Tokenizer, files: dict[str, object], config: dict | None = None) -> Path:
    """tokenizer.json plus `files` (name -> JSON value, or text for .jinja files)."""
    tokenizer.save(str(directory / "tokenizer.json"))
    for name, value in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(value if isinstance(value, str) else json.dumps(value))
    return directory


def assets(directory: Path, tokenizer: Tokenizer):
    return read_assets(directory, tokenizer.get_vocab_size())


def served(directory: Path, tokenizer: Tokenizer, messages: list[dict], tools=None, generation: bool = True):
    """What the core serves: its template with its template tokens, and the prompt ids (chat requests
    encode the rendered text without adding special tokens)."""
    read = assets(directory, tokenizer)
    text = ProbeTemplate(read.chat_template, {t.name: t.text for t in read.template_tokens}).render(
        messages, tools=tools, add_generation_prompt=generation)
    return text, read.tokenizer.encode(text, add_special_tokens=False).ids


def reference(directory: Path, messages: list[dict], tools=None, generation: bool = True):
    """transformers' rendered text and prompt ids for the same files."""
    hf = transformers.AutoTokenizer.from_pretrained(str(directory))
    text = hf.apply_chat_template(messages, tools=tools, add_generation_prompt=generation, tokenize=False)
    ids = hf.apply_chat_template(messages, tools=tools, add_generation_prompt=generation, tokenize=True)
    return text, list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def refused(directory: Path, tokenizer: Tokenizer, phrase: str) -> None:
    with pytest.raises(CheckpointError, match=phrase):
        assets(directory, tokenizer)


# --- where the chat template is ---------------------------------------------------------------------

def test_a_template_string_in_tokenizer_config_renders_as_transformers_does(tmp_path, tokenizer):
    write(tmp_path, tokenizer, {"tokenizer_config.json": {"chat_template": CHATML, "eos_token": "<|im_end|>"}})
    assert served(tmp_path, tokenizer, CONVERSATION) == reference(tmp_path, CONVERSATION)


def test_named_templates_serve_tool_use_to_requests_with_tools_and_default_to_the_rest(tmp_path, tokenizer):
    named = [{"name": "default", "template": CHATML}, {"name": "tool_use", "template": TOOL_USE},
             {"name": "rag", "template": "{{ raise_exception('rag') }}"}]
    write(tmp_path, tokenizer, {"tokenizer_config.json": {"chat_template": named, "eos_token": "<|im_end|>"}})
    for tools in (None, PROBE_TOOLS):
        assert served(tmp_path, tokenizer, CONVERSATION, tools) == reference(tmp_path, CONVERSATION, tools)
    # The tool syntax comes from the template tool requests render (default renders no calls).
    declared = assets(tmp_path, tokenizer).frontend
    assert (declared.family, declared.tool_parser) == ("hermes", spb.TOOL_PARSER_JSON_CALLS)
    called = [user("hello"), tool_call_message()]
    assert TOOL_NAME in served(tmp_path, tokenizer, called, PROBE_TOOLS, generation=False)[0]
    # The serving frontend's template renders the stored source the same way.
    serving = ChatTemplate(assets(tmp_path, tokenizer).chat_template)
    for tools in (None, PROBE_TOOLS):
        assert serving.render(CONVERSATION, tools=tools) == reference(tmp_path, CONVERSATION, tools)[0]


@pytest.mark.parametrize("chat_template, phrase", [
    ([{"name": "tool_use", "template": TOOL_USE}], "tokenizer_config.json: chat_template names templates "
                                                   "\\['tool_use'\\] but none 'default'"),
    ([{"name": "default"}], "tokenizer_config.json: chat_template\\[0\\] must be an object with a string name and template"),
    (7, "tokenizer_config.json: chat_template must be a string or a list"),
])
def test_malformed_named_templates_are_refused_naming_the_key(tmp_path, tokenizer, chat_template, phrase):
    write(tmp_path, tokenizer, {"tokenizer_config.json": {"chat_template": chat_template, "eos_token": "<|im_end|>"}})
    refused(tmp_path, tokenizer, phrase)


def test_template_files_win_over_tokenizer_config_as_in_transformers(tmp_path, tokenizer):
    stale = CHATML.replace("<|im_end|>\n", "<|im_end|>")
    write(tmp_path, tokenizer, {"tokenizer_config.json": {"chat_template": stale, "eos_token": "<|im_end|>"},
                                "chat_template.jinja": CHATML + "\n", "additional_chat_templates/tool_use.jinja": TOOL_USE})
    for tools in (None, PROBE_TOOLS):
        assert served(tmp_path, tokenizer, CONVERSATION, tools) == reference(tmp_path, CONVERSATION, tools)
    assert assets(tmp_path, tokenizer).frontend.family == "hermes"


def test_a_processor_chat_template_json_serves_when_the_tokenizer_declares_none(tmp_path, tokenizer):
    write(tmp_path, tokenizer, {"tokenizer_config.json": {"eos_token": "<|im_end|>"},
                                "chat_template.json": {"chat_template": CHATML}})
    assert assets(tmp_path, tokenizer).chat_template == CHATML
    # Both present: the tokenizer's, as AutoTokenizer renders it.
    write(tmp_path, tokenizer, {"tokenizer_config.json": {"eos_token": "<|im_end|>", "chat_template": TOOL_USE}})
    assert served(tmp_path, tokenizer, CONVERSATION) == reference(tmp_path, CONVERSATION)
    (tmp_path / "chat_template.json").write_text("[]")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    refused(tmp_path, tokenizer, "chat_template.json must hold a JSON object, not list")


@pytest.mark.parametrize("name", ["tokenizer_config.json", "generation_config.json"])
def test_a_settings_file_that_is_not_a_json_object_is_refused_naming_it(tmp_path, tokenizer, name):
    write(tmp_path, tokenizer, {"tokenizer_config.json": {"chat_template": CHATML, "eos_token": "<|im_end|>"}})
    (tmp_path / name).write_text('["chat_template"]')
    refused(tmp_path, tokenizer, f"{name} must hold a JSON object, not list")


@pytest.mark.parametrize("name", ["tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                                  "chat_template.json"])
def test_a_settings_file_past_the_json_bound_is_refused_naming_it(tmp_path, tokenizer, monkeypatch, name):
    # These files were read whole, however large (a sparse file of gigabytes: all of it in memory, then
    # parsed), where config.json and the shard index stop at MAX_JSON_NBYTES. Valid JSON, padded past
    # a bound lowered for the test, is refused too; within the bound it is read.
    write(tmp_path, tokenizer, {"tokenizer_config.json": {"eos_token": "<|im_end|>"},
                                "chat_template.json": {"chat_template": CHATML}})
    path = tmp_path / name
    path.write_text((path.read_text() if path.exists() else "{}") + " " * 8192)
    monkeypatch.setattr(tokenizer_files, "MAX_JSON_NBYTES", 8192 + 4096, raising=False)
    assert assets(tmp_path, tokenizer).chat_template == CHATML
    monkeypatch.setattr(tokenizer_files, "MAX_JSON_NBYTES", 4096, raising=False)
    refused(tmp_path, tokenizer, f"{path} is larger than 4096 bytes")


@pytest.mark.parametrize("name, bound", [("chat_template.jinja", (tokenizer_files, "MAX_JSON_NBYTES")),
                                         ("tokenizer.json", (checkpoint_assets, "MAX_TOKENIZER_NBYTES"))])
def test_a_template_or_tokenizer_past_its_bound_is_refused_naming_it(tmp_path, tokenizer, monkeypatch, name, bound):
    # Both were read whole, however large, before being parsed.
    write(tmp_path, tokenizer, {"tokenizer_config.json": {"eos_token": "<|im_end|>"}, "chat_template.jinja": CHATML})
    path = tmp_path / name
    nbytes = len(path.read_bytes())
    monkeypatch.setattr(*bound, nbytes, raising=False)
    assert assets(tmp_path, tokenizer).chat_template == CHATML
    monkeypatch.setattr(*bound, nbytes - 1, raising=False)
    refused(tmp_path, tokenizer, f"{path} is larger than {nbytes - 1} bytes")


def test_sampling_from_a_generation_config_that_is_not_a_json_object_is_refused(tmp_path):
    (tmp_path / "generation_config.json").write_text("[0.7]")
    with pytest.raises(CheckpointError, match="generation_config.json must hold a JSON object, not list"):
        recommended_sampling(tmp_path)


def test_a_checkpoint_without_a_template_is_refused_naming_the_files(tmp_path, tokenizer):
    write(tmp_path, tokenizer, {"tokenizer_config.json": {"eos_token": "</s>"}})
    refused(tmp_path, tokenizer, "declares no chat template \\(no chat_template.jinja, no chat_template in "
                                 "tokenizer_config.json or chat_template.json\\)")


def test_a_sentencepiece_only_tokenizer_is_refused_naming_the_conversion(tmp_path, tokenizer):
    write(tmp_path, tokenizer, {"tokenizer_config.json": {"chat_template": CHATML, "eos_token": "</s>"}})
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "tokenizer.model").write_bytes(b"\x0a\x00")
    refused(tmp_path, tokenizer, "has no tokenizer.json, only tokenizer.model .*save_pretrained")


# --- special tokens -------------------------------------------------------------------------------

@pytest.mark.parametrize("settings", [
    {"bos_token": "<s>", "eos_token": "</s>"},
    {"bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": False, "normalized": False,
                   "rstrip": False, "single_word": False}, "eos_token": "</s>"},
    {"bos_token": None, "eos_token": "</s>"},
], ids=["strings", "added-token objects", "bos null"])
@pytest.mark.parametrize("add_bos", [None, False, True])
def test_the_template_writes_the_only_bos_as_in_transformers(tmp_path, tokenizer, settings, add_bos):
    """add_bos_token/add_eos_token do not add a second BOS to a chat prompt (transformers encodes the
    rendered text without special tokens too, and reads the flags only without tokenizer.json)."""
    flags = {} if add_bos is None else {"add_bos_token": add_bos, "add_eos_token": add_bos}
    write(tmp_path, tokenizer, {"tokenizer_config.json": {"chat_template": INST, **settings, **flags}})
    text, ids = served(tmp_path, tokenizer, CONVERSATION, generation=False)
    assert (text, ids) == reference(tmp_path, CONVERSATION, generation=False)
    bos = tokenizer.token_to_id("<s>")
    assert ids.count(bos) == (0 if settings["bos_token"] is None else 1)
    # A completions prompt is the client's text with the tokenizer's own special tokens, as tok(text).
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert assets(tmp_path, tokenizer).tokenizer.encode("hello").ids == hf("hello")["input_ids"] == [bos,
        tokenizer.token_to_id("hello")]


def test_special_tokens_map_alone_names_the_tokens(tmp_path, tokenizer):
    """The legacy layout: tokenizer_config.json without the tokens, special_tokens_map.json with them."""
    write(tmp_path, tokenizer, {"tokenizer_config.json": {"chat_template": INST},
                                "special_tokens_map.json": {"bos_token": "<s>", "unk_token": "<unk>", "eos_token": {
                                    "content": "</s>", "lstrip": False, "normalized": False, "rstrip": False,
                                    "single_word": False}}})
    read = assets(tmp_path, tokenizer)
    assert {t.name: t.text for t in read.template_tokens} == {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    assert read.eos_token_ids == (tokenizer.token_to_id("</s>"),)
    assert served(tmp_path, tokenizer, CONVERSATION, generation=False) == \
        reference(tmp_path, CONVERSATION, generation=False)


def test_special_tokens_map_wins_only_in_the_legacy_layout(tmp_path, tokenizer):
    settings = {"chat_template": INST, "bos_token": "[INST]", "eos_token": "</s>"}
    write(tmp_path, tokenizer, {"tokenizer_config.json": settings, "special_tokens_map.json": {"bos_token": "<s>"}})
    assert served(tmp_path, tokenizer, CONVERSATION, generation=False) == \
        reference(tmp_path, CONVERSATION, generation=False)
    decoder = {str(tokenizer.token_to_id("<s>")): {"content": "<s>", "special": True, "lstrip": False, "rstrip": False,
                                                   "normalized": False, "single_word": False}}
    write(tmp_path, tokenizer, {"tokenizer_config.json": {**settings, "added_tokens_decoder": decoder}})
    assert served(tmp_path, tokenizer, CONVERSATION, generation=False) == \
        reference(tmp_path, CONVERSATION, generation=False)


def test_every_named_and_model_specific_token_is_a_template_variable(tmp_path, tokenizer):
    template = "{{ sep_token }}{{ mask_token }}{{ image_token }}" + CHATML
    write(tmp_path, tokenizer, {"tokenizer_config.json": {
        "chat_template": template, "eos_token": "<|im_end|>", "sep_token": "</s>", "mask_token": "<unk>",
        "image_token": "<|image|>", "add_bos_token": False}})
    assert served(tmp_path, tokenizer, CONVERSATION) == reference(tmp_path, CONVERSATION)
    names = {t.name for t in assets(tmp_path, tokenizer).template_tokens}
    assert names == {"eos_token", "sep_token", "mask_token", "image_token"}


@pytest.mark.parametrize("value", [5, ["</s>"], {"lstrip": False}])
def test_a_special_token_of_the_wrong_shape_is_refused_naming_it(tmp_path, tokenizer, value):
    write(tmp_path, tokenizer, {"tokenizer_config.json": {"chat_template": CHATML, "eos_token": "</s>", "bos_token": value}})
    refused(tmp_path, tokenizer, "tokenizer_config.json: bos_token ")


def test_added_tokens_special_or_not_are_single_tokens_as_in_transformers(tmp_path, tokenizer):
    write(tmp_path, tokenizer, {"tokenizer_config.json": {"chat_template": CHATML, "eos_token": "<|im_end|>"}})
    messages = [user(f"say {PLAIN_ADDED} and [INST] hello")]
    text, ids = served(tmp_path, tokenizer, messages)
    assert (text, ids) == reference(tmp_path, messages)
    assert tokenizer.token_to_id(PLAIN_ADDED) in ids


def _decoder_entry(content: str, special: bool) -> dict:
    return {"content": content, "special": special, "lstrip": False, "rstrip": False, "normalized": False,
            "single_word": False}


def test_added_tokens_decoder_adds_and_flags_tokens_as_transformers_does(tmp_path, tokenizer):
    """tokenizer_config.json declares a token tokenizer.json lacks, and [INST] as not special."""
    size = tokenizer.get_vocab_size()
    decoder = {str(tokenizer.token_to_id("[INST]")): _decoder_entry("[INST]", False),
               str(size): _decoder_entry("<extra>", True), str(size + 1): _decoder_entry("<word>", False)}
    write(tmp_path, tokenizer, {"tokenizer_config.json": {"chat_template": CHATML, "eos_token": "<|im_end|>",
                                                          "added_tokens_decoder": decoder}})
    messages = [user("say <extra> and <word> and [INST] hello")]
    text, ids = served(tmp_path, tokenizer, messages)
    assert (text, ids) == reference(tmp_path, messages)
    assert {size, size + 1} <= set(ids)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    flags = {i: t.special for i, t in assets(tmp_path, tokenizer).tokenizer.get_added_tokens_decoder().items()}
    assert flags == {i: t.special for i, t in hf.added_tokens_decoder.items()}


def test_added_tokens_decoder_that_agrees_leaves_tokenizer_json_as_it_is(tmp_path, tokenizer):
    decoder = {str(i): {"content": t.content, "special": t.special, "lstrip": t.lstrip, "rstrip": t.rstrip,
                        "normalized": t.normalized, "single_word": t.single_word}
               for i, t in tokenizer.get_added_tokens_decoder().items()}
    write(tmp_path, tokenizer, {"tokenizer_config.json": {"chat_template": CHATML, "eos_token": "<|im_end|>",
                                                          "added_tokens_decoder": decoder}})
    assert assets(tmp_path, tokenizer).tokenizer_json == (tmp_path / "tokenizer.json").read_bytes()


@pytest.mark.parametrize("decoder, phrase", [
    ({"9999": _decoder_entry("<far>", True)}, "added_tokens_decoder\\['9999'\\] declares '<far>', which tokenizer.json "
                                             "does not hold, at id 9999, not at the next free id"),
    ({"3": _decoder_entry("<s>", True)}, "added_tokens_decoder\\['3'\\] declares '<s>', which tokenizer.json holds as id 0"),
    ({"x": _decoder_entry("<s>", True)}, "added_tokens_decoder\\['x'\\] must map a token id"),
    ([], "added_tokens_decoder must map token ids"),
])
def test_an_added_tokens_decoder_that_contradicts_tokenizer_json_is_refused(tmp_path, tokenizer, decoder, phrase):
    write(tmp_path, tokenizer, {"tokenizer_config.json": {"chat_template": CHATML, "eos_token": "<|im_end|>",
                                                          "added_tokens_decoder": decoder}})
    refused(tmp_path, tokenizer, f"tokenizer_config.json: {phrase}")


# --- EOS ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("files, expected", [
    ({"generation_config.json": {"eos_token_id": 4}}, ("<|im_end|>",)),
    ({"generation_config.json": {"eos_token_id": [4, 1]}}, ("<|im_end|>", "</s>")),
    ({"config.json": {"eos_token_id": [4, 1]}}, ("<|im_end|>", "</s>")),
    ({"config.json": {"text_config": {"eos_token_id": 1}}}, ("</s>",)),
    ({"generation_config.json": {"eos_token_id": 4}, "config.json": {"eos_token_id": 1}}, ("<|im_end|>",)),
    ({"generation_config.json": {"eos_token_id": [4, 99999]}}, ("<|im_end|>",)),
], ids=["generation int", "generation list", "config list", "text_config", "generation first", "past the vocab"])
def test_eos_ids_come_from_the_generation_config_else_the_model_config(tmp_path, tokenizer, files, expected):
    write(tmp_path, tokenizer, {"tokenizer_config.json": {"chat_template": CHATML}, **files})
    assert assets(tmp_path, tokenizer).eos_token_ids == tuple(tokenizer.token_to_id(t) for t in expected)
    assert tokenizer.token_to_id("<|im_end|>") == 4 and tokenizer.token_to_id("</s>") == 1


def test_the_tokenizers_eos_token_is_an_eos_id_too(tmp_path, tokenizer):
    eos = {"content": "<|im_end|>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}
    write(tmp_path, tokenizer, {"tokenizer_config.json": {"chat_template": CHATML, "eos_token": eos},
                                "generation_config.json": {"eos_token_id": 1}})
    assert assets(tmp_path, tokenizer).eos_token_ids == (1, 4)


@pytest.mark.parametrize("files, phrase", [
    ({"generation_config.json": {"eos_token_id": "2"}}, "generation_config.json: eos_token_id must be a token id"),
    ({"config.json": {"eos_token_id": [1, 2.5]}}, "config.json: eos_token_id must be a token id"),
    ({"generation_config.json": [1]}, "generation_config.json must hold a JSON object"),
    ({}, "declares no EOS token inside the vocabulary \\(eos_token_id in generation_config.json or config.json, "
         "eos_token in tokenizer_config.json\\)"),
])
def test_eos_declarations_of_the_wrong_shape_are_refused_naming_the_file(tmp_path, tokenizer, files, phrase):
    write(tmp_path, tokenizer, {"tokenizer_config.json": {"chat_template": CHATML}, **files})
    refused(tmp_path, tokenizer, phrase)


# --- generation_config.json sampling --------------------------------------------------------------

@pytest.mark.parametrize("values, expected", [
    ({"do_sample": False, "temperature": 0.7, "top_k": 5}, spb.SamplingDefaults(temperature=0.0)),
    ({"do_sample": True, "temperature": 0.0}, spb.SamplingDefaults(temperature=0.0)),
    ({"do_sample": True, "top_k": 0, "repetition_penalty": 1.0},
     spb.SamplingDefaults(top_k=0, repetition_penalty=1.0)),
    ({"do_sample": True, "temperature": 0.6, "min_p": 0.05}, spb.SamplingDefaults(temperature=0.6, min_p=0.05)),
    ({"max_length": 4096, "pad_token_id": 0, "transformers_version": "4.51.0",
      "cache_implementation": "hybrid"}, spb.SamplingDefaults()),
    ({"max_new_tokens": 512, "max_length": 20}, spb.SamplingDefaults(max_output_tokens=512)),
], ids=["greedy", "temperature 0", "neutral values", "min_p", "unread keys", "max_new_tokens"])
def test_generation_config_keys_become_sampling_defaults(tmp_path, values, expected):
    (tmp_path / "generation_config.json").write_text(json.dumps(values))
    assert recommended_sampling(tmp_path) == expected


@pytest.mark.parametrize("limit", [0, -5, 1.5, "64", True])
def test_a_max_new_tokens_that_is_no_positive_integer_is_refused_naming_it(tmp_path, limit):
    (tmp_path / "generation_config.json").write_text(json.dumps({"max_new_tokens": limit}))
    with pytest.raises(CheckpointError, match="generation_config.json: max_new_tokens must be a positive integer"):
        recommended_sampling(tmp_path)


def test_max_new_tokens_is_capped_at_the_context_extent_and_an_explicit_limit_wins(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"max_new_tokens": 100_000, "temperature": 0.5}))
    assert merged_sampling(tmp_path, spb.SamplingDefaults(), 4096) == spb.SamplingDefaults(
        temperature=0.5, max_output_tokens=4096)
    explicit = spb.SamplingDefaults(max_output_tokens=7)
    assert merged_sampling(tmp_path, explicit, 4096).max_output_tokens == 7


def test_a_min_p_outside_its_range_is_refused_naming_it(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": True, "min_p": 1.5}))
    with pytest.raises(CheckpointError, match="generation_config.json: min_p 1.5 is outside the supported range"):
        recommended_sampling(tmp_path)
