"""A checkpoint directory is untrusted input: every truncated, corrupt, malicious or wrong file that
`helios prepare` reads raises a typed error (`CheckpointError`, a `UsageError`: exit 2) naming the
file, the tensor or the config key, and never a traceback, a hang or unbounded memory.

Each test starts from a copy of one tiny Qwen3 chat checkpoint and breaks one thing."""

from __future__ import annotations

import json
import re
import math
import os
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from helios.cli.main import main
from helios.ignition.architecture import CheckpointError
from helios.ignition.checkpoint_assets import read_assets
from helios.ignition.export import CapacityPlan
from helios.ignition.recipes import load_checkpoint
from helios.ignition.speculative_plan import SpeculativePlan
from support.chat_checkpoint import VOCAB_SIZE

WEIGHTS = "model.safetensors"
NORM = "model.norm.weight"
FAST = ["--context-tokens", "64", "--prefill-tokens", "16", "--decode-batches", "1", "--no-mixed", "--no-logprobs"]


def _header(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    length = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + length]), data[8 + length:]


def _write(path: Path, header: dict | bytes, body: bytes) -> None:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + body)


def _retyped(path: Path, name: str, **entry) -> None:
    header, body = _header(path)
    header[name].update(entry)
    _write(path, header, body)


def _edit_tensors(path: Path, edit) -> None:
    tensors = load_file(str(path))
    edit(tensors)
    save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, str(path), metadata={"format": "pt"})


def _edit_config(directory: Path, **changes) -> None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is _DELETE:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))


_DELETE = object()


def _config_id(changes: dict) -> str:
    return ",".join(f"{key}={'deleted' if value is _DELETE else repr(value)[:30]}" for key, value in changes.items())


def _refused(directory: Path, *phrases: str) -> str:
    with pytest.raises(CheckpointError) as raised:
        load_checkpoint(directory)
    for phrase in phrases:
        assert phrase in str(raised.value)
    return str(raised.value)


# --- safetensors files -------------------------------------------------------------------------

_FILE_DAMAGE = {
    "truncated": lambda data: data[: len(data) // 2],
    "zero bytes": lambda data: b"",
    "header length past the file": lambda data: struct.pack("<Q", len(data) + 100) + data[8:],
    "header length 2**63": lambda data: struct.pack("<Q", 2**63) + data[8:],
}


@pytest.mark.parametrize("damage", sorted(_FILE_DAMAGE))
def test_a_damaged_safetensors_file_is_refused_naming_it(checkpoint, damage):
    path = checkpoint / WEIGHTS
    path.write_bytes(_FILE_DAMAGE[damage](path.read_bytes()))
    _refused(checkpoint, f"cannot read {path}")


@pytest.mark.parametrize("header", [b"{not json", b"[1, 2, 3]"])
def test_a_safetensors_header_that_is_not_a_json_object_is_refused(checkpoint, header):
    _write(checkpoint / WEIGHTS, header, _header(checkpoint / WEIGHTS)[1])
    _refused(checkpoint, f"cannot read {checkpoint / WEIGHTS}")


@pytest.mark.parametrize("entry", [
    {"data_offsets": [0, 256]},  # overlaps lm_head.weight
    {"data_offsets": [509440, 10**12]},  # past the file
    {"shape": [32]},  # half the bytes its offsets span
    {"shape": [-64]},
    {"shape": [2**40, 2**40]},
    {"dtype": "Q4"},
], ids=["overlapping", "out of range", "offsets vs shape", "negative shape", "overflowing shape", "unknown dtype"])
def test_inconsistent_tensor_entries_are_refused(checkpoint, entry):
    _retyped(checkpoint / WEIGHTS, NORM, **entry)
    _refused(checkpoint, f"cannot read {checkpoint / WEIGHTS}")


def test_a_shard_that_is_not_a_regular_file_is_refused(checkpoint):
    # (A FIFO named *.safetensors blocked the reader forever; a directory raised an OSError without a name.)
    (checkpoint / WEIGHTS).unlink()
    (checkpoint / WEIGHTS).mkdir()
    _refused(checkpoint, f"{WEIGHTS} is not a regular file")


def test_an_integer_weight_is_refused_not_converted(checkpoint):
    _retyped(checkpoint / WEIGHTS, NORM, dtype="I32")
    _refused(checkpoint, f"tensor {NORM} in {WEIGHTS} is I32")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_weights_are_refused(checkpoint, value):
    name = "model.layers.0.mlp.down_proj.weight"

    def poison(tensors):
        tensors[name][3, 4] = value

    _edit_tensors(checkpoint / WEIGHTS, poison)
    _refused(checkpoint, f"tensor {name} in {WEIGHTS} holds NaN or infinite values")


def test_tensors_that_cannot_be_fused_are_refused_naming_them(checkpoint):
    name = "model.layers.0.self_attn.q_proj.weight"

    def transpose(tensors):
        tensors[name] = tensors[name].t()

    _edit_tensors(checkpoint / WEIGHTS, transpose)
    _refused(checkpoint, f"{name} [64, 128]", "do not join")


@pytest.mark.parametrize("shard, phrase", [
    ("model-00002-of-00002.safetensors", "in shard model-00002-of-00002.safetensors, which is absent"),
    ("../x.safetensors", "in '../x.safetensors', which is not a file name inside"),
    ("/etc/passwd", "in '/etc/passwd', which is not a file name inside"),
])
def test_an_index_naming_a_shard_that_is_not_there_is_refused(checkpoint, shard, phrase):
    names = load_file(str(checkpoint / WEIGHTS))
    (checkpoint / WEIGHTS).unlink()  # else transformers reads it, and never the index
    weight_map = {name: shard for name in names}
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    _refused(checkpoint, "model.safetensors.index.json places tensor", phrase)


def test_an_index_that_disagrees_with_the_shards_is_refused(checkpoint):
    names = load_file(str(checkpoint / WEIGHTS))
    (checkpoint / "other.safetensors").write_bytes((checkpoint / WEIGHTS).read_bytes())
    (checkpoint / WEIGHTS).unlink()
    weight_map = {name: WEIGHTS for name in names}
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    _refused(checkpoint, "which is absent")


# --- config.json -------------------------------------------------------------------------------

@pytest.mark.parametrize("changes, phrase", [
    ({"hidden_size": _DELETE}, "has no 'hidden_size', which the Qwen3ForCausalLM recipe reads"),
    ({"hidden_size": "64"}, "hidden_size must be an integer"),
    ({"hidden_size": 64.5}, "hidden_size must be an integer"),
    ({"hidden_size": None}, "hidden_size must be an integer"),
    ({"num_hidden_layers": True}, "num_hidden_layers must be an integer"),
    ({"num_attention_heads": [4]}, "num_attention_heads must be an integer"),
    ({"intermediate_size": "abc"}, "intermediate_size must be an integer"),
    ({"vocab_size": 0}, "vocab_size must be an integer from 1"),
    ({"vocab_size": 10**12}, "vocab_size must be an integer from 1 to 2147483647"),
    ({"num_key_value_heads": 0}, "num_key_value_heads must be an integer from 1"),
    ({"head_dim": -32}, "head_dim must be an integer from 1"),
    ({"num_hidden_layers": 10**9, "layer_types": _DELETE}, "declares 1000000000 layers"),
    ({"rms_norm_eps": -1.0}, "rms_norm_eps must be a non-negative number"),
    ({"rms_norm_eps": "small"}, "rms_norm_eps must be a non-negative number"),
    ({"rope_parameters": {"rope_theta": 0, "rope_type": "default"}}, "rope_parameters.rope_theta must be a positive"),
    ({"rope_parameters": {"rope_theta": "x", "rope_type": "default"}}, "rope_parameters.rope_theta must be a positive"),
    ({"rope_parameters": [1, 2]}, "rope_parameters must be an object"),
    ({"rope_parameters": {"rope_theta": 1e4, "rope_type": "linear"}}, "has no 'factor'"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false"),
    ({"sliding_window": "x", "use_sliding_window": True}, "sliding_window must be an integer"),
    ({"layer_types": "full_attention"}, "layer_types must be a list of strings"),
    ({"dtype": ["float32"]}, "dtype must be a string"),
    ({"architectures": {"a": 1}}, "architectures must be a list of class names"),
    ({"architectures": [["Qwen3ForCausalLM"]]}, "architectures must be a list of class names"),
    ({"architectures": "Qwen3ForCausalLM"}, "architectures must be a list of class names"),
], ids=lambda value: _config_id(value) if isinstance(value, dict) else None)
def test_a_config_with_a_missing_or_mistyped_key_is_refused_naming_it(checkpoint, changes, phrase):
    _edit_config(checkpoint, **changes)
    _refused(checkpoint, phrase)


@pytest.mark.parametrize("text, phrase", [
    ('{"rms_norm_eps": NaN}', "rms_norm_eps must be a non-negative number, got nan"),
    ('{"rope_theta": Infinity}', "rope_theta must be a positive number, got inf"),
    ('{"rope_theta": 1e999}', "rope_theta must be a positive number, got inf"),
    ('{"unused_setting": Infinity}', None),  # transformers writes float("inf") so; only the keys read matter
    ("[" * 100_000 + "]" * 100_000, "cannot read"),
])
def test_non_finite_numbers_in_the_config_are_refused_where_read(checkpoint, text, phrase):
    config = (checkpoint / "config.json").read_text()
    if text.startswith("{"):  # one key replaced by a value JSON does not have
        key = text[2:text.index('"', 2)]
        config = json.dumps({**json.loads(config), key: 0}).replace(f'"{key}": 0', text[1:-1])
    else:
        config = text
    (checkpoint / "config.json").write_text(config)
    if phrase is None:
        assert load_checkpoint(checkpoint).architecture.vocab_size == VOCAB_SIZE
    else:
        _refused(checkpoint, phrase)


# --- tokenizer and chat template ---------------------------------------------------------------

def _assets(directory: Path, vocab_size: int = VOCAB_SIZE):
    return read_assets(directory, vocab_size)


def _assets_refused(directory: Path, phrase: str, vocab_size: int = VOCAB_SIZE) -> None:
    with pytest.raises(CheckpointError, match=phrase):
        _assets(directory, vocab_size)


@pytest.mark.parametrize("damage", [
    lambda data: b"{nope", lambda data: b'{"version": "1.0", "model": 5}', lambda data: b"\xff\xfe\x00",
    lambda data: data[: len(data) // 3],
], ids=["not json", "not a tokenizer", "not utf-8", "truncated"])
def test_a_corrupt_tokenizer_is_refused_naming_it(checkpoint, damage):
    path = checkpoint / "tokenizer.json"
    path.write_bytes(damage(path.read_bytes()))
    _assets_refused(checkpoint, "cannot read .*tokenizer.json")


def test_a_tokenizer_larger_than_the_model_vocabulary_is_refused(checkpoint):
    _assets_refused(checkpoint, f"holds {VOCAB_SIZE} tokens, more than the model's vocab_size 200", vocab_size=200)


def test_a_chat_template_file_that_is_not_utf8_is_refused(checkpoint):
    (checkpoint / "chat_template.jinja").write_bytes(b"\xff\xfe{{ x }}")
    _assets_refused(checkpoint, "cannot read .*chat_template.jinja")


def _set_tokenizer_config(directory: Path, **settings) -> None:
    path = directory / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **settings}))


def test_named_templates_with_a_malformed_name_are_refused(checkpoint):
    _set_tokenizer_config(checkpoint, chat_template=[{"name": ["default"], "template": "x"}])
    _assets_refused(checkpoint, "tokenizer_config.json: chat_template\\[0\\] must be an object with a string name")


def test_a_boolean_eos_id_is_not_token_one(checkpoint):
    (checkpoint / "generation_config.json").write_text(json.dumps({"eos_token_id": True}))
    _set_tokenizer_config(checkpoint, eos_token="<absent>")
    _assets_refused(checkpoint, "generation_config.json: eos_token_id must be a token id or a list of token ids, not True")


@pytest.mark.parametrize("template, phrase", [
    ("{{ 1 // 0 }}", "ZeroDivisionError"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "RecursionError"),
    ("{{ 'x' * 10**8 }}", "repetition of 100000000 items is too large"),
    ("{{ [0] * 10**8 }}", "repetition of 100000000 items is too large"),
    ("{{ (7 ** 100000) % 10 }}", "the power 7 \\*\\* 100000 is too large"),
    ("{% for i in range(99999) %}{{ 'x' * 100 }}{% endfor %}", "rendered text exceeds"),
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "SecurityError: access to attribute '__class__'"),
], ids=["zero division", "recursion", "huge string", "huge list", "huge power", "huge output", "escape"])
def test_a_template_that_fails_or_grows_without_bound_is_refused(checkpoint, template, phrase):
    _set_tokenizer_config(checkpoint, chat_template=template)
    _assets_refused(checkpoint, f"the chat template cannot render a single user message: .*{phrase}")


# --- command line ------------------------------------------------------------------------------

@pytest.mark.parametrize("options, phrase", [
    ({"context_tokens": 10**12}, "context_tokens 1000000000000 exceeds"),
    ({"page_tokens": 10**9}, "page_tokens 1000000000 exceeds"),
    ({"prefill_tokens": 4096, "context_tokens": 2048}, "prefill_tokens 4096 exceeds context_tokens"),
    ({"decode_batches": (1, 10**9)}, "batch capacities are at most"),
    ({"context_tokens": 1 << 24, "page_tokens": 1, "decode_batches": (4096,)}, "exceed 2147483647 pages"),
])
def test_capacities_past_what_can_be_captured_or_declared_are_refused(options, phrase):
    with pytest.raises(CheckpointError, match=phrase):
        CapacityPlan(**options)


@pytest.mark.parametrize("options, phrase", [
    ({"widths": (1, 10**9)}, "speculative widths must lie between 1 and 64"),
    ({"batches": (10**9,)}, "speculative batch capacities must lie between 1 and 4096"),
    ({"draft_tokens": 10**6}, "draft_tokens must lie between 1 and 64"),
])
def test_speculative_capacities_past_what_can_be_captured_are_refused(options, phrase):
    with pytest.raises(CheckpointError, match=phrase):
        SpeculativePlan(Path("draft"), **options)


@pytest.fixture(scope="module")
def key(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("key") / "publisher.key"
    assert main(["keygen", "-o", str(path)]) == 0
    return path


def _prepare(checkpoint: Path, output: Path, key: Path, *extra: str) -> int:
    return main(["prepare", str(checkpoint), "-o", str(output), "--key", str(key), "--namespace", "test/hostile",
                 *FAST, *extra])


def test_an_output_that_is_a_directory_or_in_a_missing_one_is_refused_before_capture(pristine, key, tmp_path,
                                                                                      capsys, monkeypatch):
    import helios.ignition.export as export

    def no_capture(*args, **kwargs):
        raise AssertionError("captured before the output path was checked")

    monkeypatch.setattr(export, "capture_all", no_capture)
    assert _prepare(pristine, tmp_path, key) == 2
    assert f"-o {tmp_path} is a directory" in capsys.readouterr().err
    assert _prepare(pristine, tmp_path / "absent" / "model.core", key) == 2
    assert f"the directory {tmp_path / 'absent'} does not exist" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_failed_prepare_keeps_an_existing_output_and_leaves_no_temporary_file(checkpoint, key, tmp_path, capsys):
    output = tmp_path / "out" / "model.core"
    output.parent.mkdir()
    output.write_bytes(b"an earlier core")
    (checkpoint / "tokenizer.json").write_text("{nope")
    assert _prepare(checkpoint, output, key) == 2
    assert "tokenizer.json" in capsys.readouterr().err
    assert output.read_bytes() == b"an earlier core"
    assert [p.name for p in output.parent.iterdir()] == ["model.core"]


def test_a_finite_checkpoint_still_loads(checkpoint):
    recipe = load_checkpoint(checkpoint)
    assert recipe.architecture.vocab_size == VOCAB_SIZE
    assert all(torch.isfinite(weight.tensor).all() for weight in recipe.weights)


@pytest.mark.parametrize("options, phrase", [
    (["--namespace", "evil ns"], "--namespace: publisher namespace 'evil ns' contains whitespace"),
    (["--namespace", "x" * 300], "--namespace: a publisher namespace is 1 to 256 bytes"),
    (["--served-id", "id\x1b[2J"], "--served-id 'id\\\\x1b\\[2J' is empty or holds control characters"),
    (["--served-id", "two\nlines"], "holds control characters"),
    (["--license", "\x1b]0;title\x07"], "--license holds control characters"),
], ids=["namespace with a space", "long namespace", "escape in served id", "newline in served id", "escape in license"])
def test_signed_text_options_are_checked_before_capture(pristine, key, tmp_path, capsys, monkeypatch, options, phrase):
    import helios.ignition.export as export

    def no_capture(*args, **kwargs):
        raise AssertionError("captured before the signed text was checked")

    monkeypatch.setattr(export, "capture_all", no_capture)
    argv = ["prepare", str(pristine), "-o", str(tmp_path / "model.core"), "--key", str(key),
            "--namespace", "test/hostile", *FAST, *options]
    assert main(argv) == 2
    assert re.search(phrase, capsys.readouterr().err)
    assert list(tmp_path.iterdir()) == []


def test_a_shard_index_that_is_not_a_regular_file_is_refused(checkpoint):
    (checkpoint / WEIGHTS).rename(checkpoint / "model-00001-of-00001.safetensors")  # else the index is not read
    os.mkfifo(checkpoint / "model.safetensors.index.json")  # reading it would block forever
    _refused(checkpoint, "model.safetensors.index.json is not a regular file")


def test_a_weight_that_overflows_float16_is_refused_when_preparing_in_float16(checkpoint):
    def enlarge(tensors):
        tensors["model.layers.0.mlp.down_proj.weight"][0, 0] = 1e6

    _edit_tensors(checkpoint / WEIGHTS, enlarge)
    with pytest.raises(CheckpointError, match="weight layers.0.down.weight overflows float16"):
        load_checkpoint(checkpoint, "float16")
    assert load_checkpoint(checkpoint, "bfloat16").architecture.dtype == "bfloat16"


def test_rope_settings_that_yield_infinite_frequencies_are_refused(checkpoint):
    _edit_config(checkpoint, rope_parameters={"rope_type": "linear", "factor": 1e-300, "rope_theta": 1e4})
    _refused(checkpoint, "rope settings yield non-finite rotary frequencies")


def test_scaling_that_yields_an_infinite_attention_scale_is_refused(tmp_path):
    from ignition.hf_checkpoints import DEEPSEEK_DENSE, random_model, write_checkpoint

    directory = write_checkpoint(random_model(DEEPSEEK_DENSE), tmp_path / "deepseek")
    config = json.loads((directory / "config.json").read_text())
    config["rope_parameters"]["mscale_all_dim"] = 1e300
    (directory / "config.json").write_text(json.dumps(config))
    _refused(directory, "config.json yields non-finite {'latent scale': inf}")


# --- vision-language checkpoints ---------------------------------------------------------------

_PROCESSOR = {"min_pixels": 3136, "max_pixels": 15680, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.25, 0.25, 0.25]}


@pytest.mark.parametrize("changes, phrase", [
    ({"image_std": [0.25, 0.0, 0.25]}, "the std positive"),
    ({"image_mean": ["nan", 0.5, 0.5]}, "3 finite values each"),
    ({"image_mean": [0.5, 0.5]}, "3 finite values each"),
    ({"min_pixels": 20000}, "1 <= min_pixels <= max_pixels"),
    ({"max_pixels": 2**40}, "max_pixels <= 2147483647"),
    ({"image_mean": 5}, "lacks image_mean, image_std or pixel bounds"),
], ids=["zero std", "nan mean", "two means", "min above max", "huge max", "mean not a list"])
def test_image_processor_settings_that_would_break_every_image_are_refused(tmp_path, changes, phrase):
    from helios.ignition.preparation.vision_contract import read_image_processor

    (tmp_path / "preprocessor_config.json").write_text(json.dumps({**_PROCESSOR, **changes}))
    with pytest.raises(CheckpointError, match=phrase):
        read_image_processor(tmp_path)


@pytest.mark.parametrize("text", ['{"image_std": NaN}', "[1]"])
def test_an_image_processor_file_that_is_not_a_strict_json_object_is_refused(tmp_path, text):
    from helios.ignition.preparation.vision_contract import read_image_processor

    (tmp_path / "preprocessor_config.json").write_text(text)
    with pytest.raises(CheckpointError, match="needs a readable preprocessor_config.json"):
        read_image_processor(tmp_path)


def test_patch_capacities_past_what_can_be_captured_are_refused(tmp_path):
    from helios.ignition.program_spec import Capacity, Operation
    from helios.ignition.vision_plan import vision_preparation
    from vision.tiny_vl import tiny_model

    tiny_model().save_pretrained(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({**_PROCESSOR, "max_pixels": 2**31 - 1}))
    recipe = load_checkpoint(tmp_path)
    text = [(Operation.DECODE, Capacity(1, 1)), (Operation.PREFILL, Capacity(1, 16))]
    with pytest.raises(CheckpointError, match="patch capacities are at most 262144, got 10956548"):
        vision_preparation(tmp_path, recipe, text)
    with pytest.raises(CheckpointError, match="patch capacities are at most 262144, got 1000000000"):
        vision_preparation(tmp_path, recipe, text, (10**9,))
    assert vision_preparation(tmp_path, recipe, text, (64,)).patch_capacities == (64,)


def test_a_non_finite_engram_table_is_refused(checkpoint):
    from helios.ignition.engram import EngramTableError, read_engram, write_engram

    table = torch.randn(7, 8)
    table[2, 3] = math.nan
    write_engram(checkpoint, table, torch.randn(64, 16), 2, (11, 13, 15, 17))
    with pytest.raises(EngramTableError, match="engram.table holds NaN or infinite values"):
        read_engram(checkpoint, 64, "float32")


def test_sigterm_during_capture_leaves_no_partial_core(pristine, key, tmp_path, capsys, monkeypatch):
    import signal

    import helios.ignition.export as export

    def terminated_while_capturing(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # the handler raises here, in the main thread
        raise AssertionError("SIGTERM did not stop preparation")

    monkeypatch.setattr(export, "capture_all", terminated_while_capturing)
    before = signal.getsignal(signal.SIGTERM)
    assert _prepare(pristine, tmp_path / "model.core", key) == 128 + signal.SIGTERM
    assert capsys.readouterr().err.splitlines()[-1] == "helios prepare: terminated"
    assert list(tmp_path.iterdir()) == []  # the weights already streamed to a temporary file are gone
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "tokenizer.json"])
def test_an_output_that_would_replace_a_checkpoint_file_is_refused(checkpoint, key, capsys, name):
    before = (checkpoint / name).read_bytes()
    assert _prepare(checkpoint, checkpoint / name, key) == 2
    assert f"-o {checkpoint / name} would replace a file of the checkpoint" in capsys.readouterr().err
    assert (checkpoint / name).read_bytes() == before


def test_a_mistyped_key_no_generic_check_knows_still_raises_a_checkpoint_error(tmp_path):
    from vision.tiny_vl import tiny_model

    tiny_model().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    # read by the Qwen2.5-VL recipe alone (window_size, the example before, is now checked with config.json)
    config["vision_config"]["fullatt_block_indexes"] = ["wide"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    _refused(tmp_path, "cannot prepare the Qwen2_5_VLForConditionalGeneration checkpoint", "'wide'")


def test_a_placeholder_context_length_is_not_refused(checkpoint):
    _edit_config(checkpoint, max_position_embeddings=10**12)  # some configs state a huge one; nothing is sized by it
    assert load_checkpoint(checkpoint).architecture.vocab_size == VOCAB_SIZE


def test_patch_capacities_for_a_text_only_checkpoint_are_refused_not_ignored(pristine, key, tmp_path, capsys):
    assert _prepare(pristine, tmp_path / "model.core", key, "--patch-capacities", "64") == 2
    assert "patch capacities apply to vision-language checkpoints; Qwen3ForCausalLM is text-only" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_tensor_a_sparse_file_claims_past_the_memory_available_is_refused_before_it_is_read(checkpoint,
                                                                                              monkeypatch):
    """A file whose holes cover what its header claims (a preallocated download cut short) passes
    safetensors' checks: a 512 MiB norm weight was read in full (terabytes: the process killed for
    memory) before the recipe compared its shape with the config."""
    import helios.ignition.recipes.checkpoint as checkpoint_module

    header, body = _header(checkpoint / WEIGHTS)
    start, stop = header[NORM]["data_offsets"]
    for entry in header.values():  # the norm's bytes moved to the end, as the claimed 512 MiB
        if isinstance(entry, dict) and "data_offsets" in entry and entry["data_offsets"][0] >= stop:
            entry["data_offsets"] = [offset - (stop - start) for offset in entry["data_offsets"]]
    body = body[:start] + body[stop:]
    claimed = 512 << 20
    header[NORM] = {"dtype": "F32", "shape": [claimed // 4], "data_offsets": [len(body), len(body) + claimed]}
    _write(checkpoint / WEIGHTS, header, body)
    with open(checkpoint / WEIGHTS, "r+b") as handle:  # holes, not bytes: nothing is written to disk
        handle.truncate(os.path.getsize(checkpoint / WEIGHTS) + claimed)
    monkeypatch.setattr(checkpoint_module, "available_memory_nbytes", lambda: 64 << 20, raising=False)
    _refused(checkpoint, f"tensor {NORM} in {WEIGHTS} is [{claimed // 4}] F32", "more than the 67108864 bytes")
