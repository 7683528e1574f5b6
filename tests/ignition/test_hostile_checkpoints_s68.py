"""Hostile inputs and interruptions `test_hostile_checkpoints` and `test_hostile_checkpoint_values`
did not reach (session 68), each of which escaped as a traceback, an abort or a core that served
differently from the reference.

Each checkpoint test starts from a copy of the tiny Qwen3 chat checkpoint (`checkpoint` in conftest)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from helios.cli.main import main
from helios.ignition.architecture import CheckpointError
from helios.ignition.checkpoint_assets import read_assets
from helios.ignition.recipes import load_checkpoint
from support.chat_checkpoint import VOCAB_SIZE

WEIGHTS = "model.safetensors"
FAST = ["--context-tokens", "64", "--prefill-tokens", "16", "--decode-batches", "1", "--no-mixed", "--no-logprobs"]


@pytest.fixture(scope="module")
def key(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("key") / "publisher.key"
    assert main(["keygen", "-o", str(path)]) == 0
    return path


# --- Ctrl-C ------------------------------------------------------------------------------------

_POOLED_PREPARE = """\
import sys

import helios.ignition.export as export
from helios.cli.main import main

export.default_workers = lambda num_jobs, num_layers: 2  # a large model's capture pool, for a tiny one

if __name__ == "__main__":  # the spawned workers import this file too
    sys.exit(main(sys.argv[1:]))
"""


def _spawned_workers(pid: int) -> list[int]:
    """The capture workers `pid` has started (children running multiprocessing's spawn_main)."""
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue
    workers = []
    for child in children:
        try:
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                workers.append(child)
        except OSError:
            continue
    return workers


@pytest.mark.timeout(120)
def test_ctrl_c_while_workers_capture_prints_one_line_and_leaves_no_file(pristine, key, tmp_path):
    # A terminal's Ctrl-C reaches the whole process group: each spawned capture worker printed a
    # KeyboardInterrupt traceback of its own beside `helios prepare: interrupted`.
    script = tmp_path / "pooled_prepare.py"
    script.write_text(_POOLED_PREPARE)
    output = tmp_path / "out" / "model.core"
    output.parent.mkdir()
    command = [sys.executable, str(script), "prepare", str(pristine), "-o", str(output), "--key", str(key),
               "--namespace", "test/hostile", *FAST]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        lines = []
        for line in process.stderr:  # the recipe is read and the frontend derived: the capture comes next
            lines.append(line)
            if "frontend:" in line:
                break
        while len(_spawned_workers(process.pid)) < 2 and process.poll() is None:
            time.sleep(0.05)
        assert process.poll() is None, "".join(lines)
        os.killpg(process.pid, signal.SIGINT)  # as the terminal sends it
        rest = process.stderr.read()
        assert process.wait() == 130
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert "Traceback" not in rest and "KeyboardInterrupt" not in rest, rest
    assert rest.strip().splitlines()[-1] == "helios prepare: interrupted"
    assert list(output.parent.iterdir()) == []




# --- the output path ---------------------------------------------------------------------------

@pytest.mark.parametrize("where, phrase", [
    ("long name", "File name too long"),  # 250 bytes fit a name, not the temporary .NAME.XXXXXXXX.tmp
    ("/proc", "No such file or directory"),  # a directory that takes no new file
])
def test_an_output_no_file_can_be_written_beside_is_refused_before_the_checkpoint_is_read(
        pristine, key, tmp_path, capsys, monkeypatch, where, phrase):
    # Refused only after the whole checkpoint was read and its frontend derived (minutes for a large one).
    import helios.ignition.export as export

    def no_load(*args, **kwargs):
        raise AssertionError("the checkpoint was read before the output path was checked")

    monkeypatch.setattr(export, "load_checkpoint", no_load)
    output = tmp_path / ("m" * 245 + ".core") if where == "long name" else Path("/proc/model.core")
    assert main(["prepare", str(pristine), "-o", str(output), "--key", str(key), "--namespace", "test/hostile",
                 *FAST]) == 2
    assert f"-o {output}: cannot create a file beside it ({phrase})" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# --- progress ----------------------------------------------------------------------------------

def test_reading_a_large_checkpoint_reports_progress_before_the_recipe_line(pristine, key, tmp_path, capsys,
                                                                             monkeypatch):
    # Nothing was printed while the weights were read: minutes of silence for a large checkpoint.
    import helios.ignition.export as export
    import helios.ignition.recipes.checkpoint as checkpoint_module

    class Stop(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stop

    # The tiny checkpoint read as a large one (raising=False: the tree before the progress lines has no bound).
    monkeypatch.setattr(checkpoint_module, "PROGRESS_NBYTES", 1, raising=False)
    monkeypatch.setattr(export, "capture_all", stop)
    with pytest.raises(Stop):
        main(["prepare", str(pristine), "-o", str(tmp_path / "model.core"), "--key", str(key),
              "--namespace", "test/hostile", *FAST])
    lines = [line.strip() for line in capsys.readouterr().err.splitlines()]
    reads = [line for line in lines if line.startswith("read ")]
    assert reads and reads[-1] == "read 100% of the checkpoint's 0.0 GB of weights" and len(reads) <= 10, lines
    assert lines.index(reads[-1]) < next(i for i, line in enumerate(lines) if line.startswith("recipe:"))
    assert list(tmp_path.iterdir()) == []


# --- tokenizer.json ----------------------------------------------------------------------------

def _edit_tokenizer(directory: Path, **settings) -> None:
    path = directory / "tokenizer.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **settings}))


_SPECIAL = {"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}
_SEQUENCE = {"Sequence": {"id": "A", "type_id": 0}}


@pytest.mark.parametrize("settings, phrase", [
    # tokenizers panics in Rust (pyo3's PanicException, a BaseException: a traceback before) ...
    ({"normalizer": {"type": "Precompiled", "precompiled_charsmap": "AAAA"}},
     "cannot read .*tokenizer.json: Precompiled"),
    ({"post_processor": {"type": "TemplateProcessing", "single": [_SPECIAL, _SEQUENCE], "pair": [_SEQUENCE],
                         "special_tokens": {}}},  # a special token the template uses but does not define
     "tokenizer.json cannot encode text such as .*: no entry found for key"),
    # ... or raises its bare Exception at the first encode (a traceback before) ...
    ({"model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                "max_input_chars_per_word": 100, "vocab": {"a": 0, "b": 1}}},
     "tokenizer.json cannot encode text such as .*Missing \\[UNK\\] token"),
    ({"model": {"type": "Unigram", "unk_id": None, "vocab": [["a", 0.0], ["b", -1.0]]}},
     "tokenizer.json cannot encode text such as .*`unk_id` is missing"),
    # ... or adds an id past the embedding to every completion prompt (an index error on the device).
    ({"post_processor": {"type": "BertProcessing", "sep": ["<|im_end|>", 100_000], "cls": ["<|im_start|>", 2]}},
     "tokenizer.json encodes text such as .* to the id 100000, past the model's vocab_size 320"),
], ids=["corrupt charsmap", "undefined template token", "wordpiece without unk", "unigram without unk",
        "post-processor id past the vocabulary"])
def test_a_tokenizer_that_cannot_encode_served_text_is_refused_naming_it(checkpoint, settings, phrase):
    _edit_tokenizer(checkpoint, **settings)
    with pytest.raises(CheckpointError, match=phrase):
        read_assets(checkpoint, VOCAB_SIZE)


def test_tokenizer_padding_and_truncation_are_not_served(checkpoint, pristine):
    # transformers pads and truncates a call only when asked; the core served the file's settings, so
    # every prompt was cut to 4 tokens and padded to 6 (a padding of 10**12 aborted the process).
    _edit_tokenizer(checkpoint, truncation={"direction": "Right", "max_length": 4, "strategy": "LongestFirst",
                                            "stride": 0},
                    padding={"strategy": {"Fixed": 6}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0,
                             "pad_type_id": 0, "pad_token": "<|im_end|>"})
    served = read_assets(checkpoint, VOCAB_SIZE)
    stored = json.loads(served.tokenizer_json)
    assert stored["padding"] is None and stored["truncation"] is None
    text = "the quick brown fox jumps over the lazy dog"
    reference = read_assets(pristine, VOCAB_SIZE).tokenizer.encode(text).ids
    assert len(reference) > 6
    assert served.tokenizer.encode(text).ids == reference


# --- chat template -----------------------------------------------------------------------------

@pytest.mark.parametrize("template, phrase", [
    ("{% if true %}" * 400 + "x" + "{% endif %}" * 400, "RecursionError"),
    ("{{ " + " + ".join(["1"] * 5000) + " }}", "RecursionError"),
    ("{% for a in [1] %}" * 101 + "x" + "{% endfor %}" * 101, "IndentationError: too many levels of indentation"),
], ids=["deeply nested blocks", "a long expression", "100 nested loops"])
def test_a_chat_template_that_jinja_cannot_compile_is_refused(checkpoint, template, phrase):
    # Only jinja2.TemplateError was taken: Python's RecursionError and SyntaxError were tracebacks.
    path = checkpoint / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "chat_template": template}))
    with pytest.raises(CheckpointError, match=f"the chat template does not compile: {phrase}"):
        read_assets(checkpoint, VOCAB_SIZE)


# --- shards ------------------------------------------------------------------------------------

def test_with_a_shard_index_only_the_shards_it_names_are_read(checkpoint, pristine):
    # A Mistral repository holds its weights twice: HF-named shards with their index, and
    # consolidated.safetensors in Mistral's names, which transformers (and vLLM) never read. Every
    # *.safetensors file was read: prepare refused the download as holding tensors twice.
    tensors = load_file(str(checkpoint / WEIGHTS))
    names = sorted(tensors)
    shards = {name: f"model-0000{1 + (i >= len(names) // 2)}-of-00002.safetensors" for i, name in enumerate(names)}
    for shard in set(shards.values()):
        save_file({name: tensors[name] for name in names if shards[name] == shard}, str(checkpoint / shard))
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": shards}))
    (checkpoint / WEIGHTS).rename(checkpoint / "consolidated.safetensors")  # the same tensors once more
    expected = load_checkpoint(pristine)
    recipe = load_checkpoint(checkpoint)
    assert [weight.name for weight in recipe.weights] == [weight.name for weight in expected.weights]
    assert all(torch.equal(a.tensor, b.tensor) for a, b in zip(recipe.weights, expected.weights))



# --- tensors a recipe reshapes -----------------------------------------------------------------

@pytest.fixture(scope="module")
def reshaped_families(tmp_path_factory) -> dict[str, Path]:
    from ignition.hf_checkpoints import BAMBA, QWEN3_NEXT, random_model, write_checkpoint

    return {family.name: write_checkpoint(random_model(family), tmp_path_factory.mktemp(family.name))
            for family in (QWEN3_NEXT, BAMBA)}


@pytest.mark.parametrize("family, name", [
    ("qwen3_next", "model.layers.0.linear_attn.in_proj_ba.weight"),
    ("qwen3_next", "model.layers.0.linear_attn.in_proj_qkvz.weight"),
    ("qwen3_next", "model.layers.0.linear_attn.conv1d.weight"),
    ("bamba", "model.layers.0.mamba.conv1d.weight"),
])
def test_a_transposed_tensor_a_recipe_reshapes_is_refused_naming_it(reshaped_families, tmp_path, family, name):
    # Reshaped by element count alone, a transposed tensor was taken and served scrambled (transformers
    # refuses its shape when it loads the checkpoint).
    directory = Path(shutil.copytree(reshaped_families[family], tmp_path / family))
    (path,) = directory.glob("*.safetensors")
    tensors = load_file(str(path))
    shape = list(tensors[name].shape)
    tensors[name] = tensors[name].transpose(0, -1).contiguous()
    save_file(tensors, str(path), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=re.escape(f"tensor {name} is {shape[::-1]}, where the reference's "
                                                        f"parameter is {shape}")):
        load_checkpoint(directory)
