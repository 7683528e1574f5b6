"""Block-quantized float8 DeepSeek-V3 checkpoints (``quantization_config`` fp8, ``weight_scale_inv``)
prepare by dequantizing at prepare: a tiny DeepSeek-V3 checkpoint whose projections are quantized
into that format, as the real checkpoints store them, gives transformers' logits and greedy tokens on
the dequantized weights; malformed quantization raises typed errors.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file

from helios.ignition.architecture import CheckpointError
from helios.ignition.capture import build_program
from helios.ignition.program_spec import Capacity, Operation, program_spec
from helios.ignition.recipes import UnsupportedCheckpoint, load_checkpoint
from helios.ignition.recipes.fp8_blocks import QuantizationError, dequantize_blocks

from .driver import PagedModel, Sequence, generate
from .hf_checkpoints import DEEPSEEK, random_model, write_checkpoint

PROMPT = [3, 17, 101, 5, 9, 64, 2, 88, 41, 7, 30]
BLOCK = [16, 8]  # several blocks per matrix, partial blocks at the edges (24, 48, 96 ... rows/columns)
FP8_MAX = torch.finfo(torch.float8_e4m3fn).max
PROJECTIONS = ("_proj.weight", "_proj_with_mqa.weight")


def quantize(weight: torch.Tensor, block) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8_e4m3fn weight, float32 scale_inv per block) as DeepSeek's checkpoints store them."""
    rows, columns = block
    out_dim, in_dim = weight.shape
    scales = torch.empty(-(-out_dim // rows), -(-in_dim // columns))
    quantized = torch.empty(weight.shape, dtype=torch.float8_e4m3fn)
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            tile = weight[i * rows:(i + 1) * rows, j * columns:(j + 1) * columns]
            scale = tile.abs().max().clamp(min=1e-12) / FP8_MAX
            scales[i, j] = scale
            quantized[i * rows:(i + 1) * rows, j * columns:(j + 1) * columns] = (tile / scale).to(torch.float8_e4m3fn)
    return quantized, scales


def reference_dequantized(quantized: torch.Tensor, scales: torch.Tensor, block) -> torch.Tensor:
    """The block-scale definition, element by block, in float64 (then float32)."""
    rows, columns = block
    out = torch.empty(quantized.shape, dtype=torch.float64)
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            tile = quantized[i * rows:(i + 1) * rows, j * columns:(j + 1) * columns].to(torch.float64)
            out[i * rows:(i + 1) * rows, j * columns:(j + 1) * columns] = tile * scales[i, j].double()
    return out.float()


def write_fp8(source: Path, target: Path, block=BLOCK, quantization=None, edit=None) -> dict[str, torch.Tensor]:
    """`source`'s checkpoint with every attention/MLP/expert projection block-quantized; returns the
    dequantized tensors. `edit(tensors)` may break the result; `quantization` replaces the config's."""
    target.mkdir(parents=True, exist_ok=True)
    with safe_open(str(source / "model.safetensors"), framework="pt") as handle:
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    dequantized = dict(tensors)
    for name in [n for n in tensors if n.startswith("model.layers.") and n.endswith(PROJECTIONS)]:
        tensors[name], tensors[name + "_scale_inv"] = quantize(tensors[name], block)
        dequantized[name] = reference_dequantized(tensors[name], tensors[name + "_scale_inv"], block)
    if edit is not None:
        edit(tensors)
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = quantization or {
        "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": list(block)}
    (target / "config.json").write_text(json.dumps(config))
    return dequantized


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(plain checkpoint dir, fp8 checkpoint dir, transformers model on the dequantized weights)."""
    root = tmp_path_factory.mktemp("fp8")
    model = random_model(DEEPSEEK)
    plain = write_checkpoint(model, root / "plain")
    dequantized = write_fp8(plain, root / "fp8")
    save_file(dequantized, str(plain / "model.safetensors"), metadata={"format": "pt"})  # the plain twin
    reference = transformers.AutoModelForCausalLM.from_pretrained(plain, dtype=torch.float32).eval()
    reference.generation_config.eos_token_id = None
    reference.generation_config.pad_token_id = 0
    return plain, root / "fp8", reference


def test_dequantization_is_the_exact_block_product():
    weight = torch.randn(37, 21)
    quantized, scales = quantize(weight, (16, 8))
    assert scales.shape == (3, 3)
    assert torch.equal(dequantize_blocks(quantized, scales, (16, 8)), reference_dequantized(quantized, scales, (16, 8)))
    assert (dequantize_blocks(quantized, scales, (16, 8)) - weight).abs().max() < 0.1 * weight.abs().max()


def test_prepared_weights_equal_the_unquantized_checkpoint_of_the_same_values(checkpoints):
    plain, fp8, _ = checkpoints
    ours, twin = load_checkpoint(fp8), load_checkpoint(plain)
    assert ours.architecture == twin.architecture
    assert [w.name for w in ours.weights] == [w.name for w in twin.weights]
    for mine, theirs in zip(ours.weights, twin.weights):
        assert torch.equal(mine.tensor, theirs.tensor), mine.name
    as_bf16 = load_checkpoint(fp8, dtype="bfloat16")
    expert = next(w for w in as_bf16.weights if w.name == "layers.2.experts.gate_up")
    assert expert.tensor.dtype == torch.bfloat16
    assert torch.equal(expert.tensor, next(w for w in twin.weights if w.name == expert.name).tensor.bfloat16())


def test_greedy_tokens_and_logits_equal_transformers_on_the_dequantized_weights(checkpoints):
    _, fp8, reference = checkpoints
    recipe = load_checkpoint(fp8)
    arch = recipe.architecture
    programs = {op: (program_spec(arch, op, capacity, 4), build_program(arch, op, 4))
                for op, capacity in ((Operation.PREFILL, Capacity(1, 16)), (Operation.DECODE, Capacity(1, 1)))}
    model = PagedModel(recipe.weight_tensors, programs)
    sequence = Sequence(0, list(PROMPT))
    generate(model, [sequence], 12, chunk=16)
    with torch.no_grad():
        ids = torch.tensor([PROMPT])
        out = reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                                 output_logits=True, return_dict_in_generate=True)
    assert sequence.generated == out.sequences[0, len(PROMPT):].tolist()
    expected = torch.cat(out.logits)
    error = (torch.stack(sequence.logits) - expected).abs().max() / expected.abs().max()
    assert error < 1e-4


def _drop_scale(tensors):
    del tensors["model.layers.0.self_attn.o_proj.weight_scale_inv"]


def _wrong_scale_shape(tensors):
    name = "model.layers.1.mlp.down_proj.weight_scale_inv"
    tensors[name] = tensors[name][:, :-1].contiguous()


def _orphan_scale(tensors):
    tensors["model.layers.0.input_layernorm.weight_scale_inv"] = torch.ones(1, 1)


def _integer_scales(tensors):
    name = "model.layers.0.self_attn.o_proj.weight_scale_inv"
    tensors[name] = tensors[name].to(torch.int32)


@pytest.mark.parametrize("edit,message", [
    (_drop_scale, "o_proj.weight has no model.layers.0.self_attn.o_proj.weight_scale_inv"),
    (_wrong_scale_shape, r"down_proj.weight_scale_inv has shape \[4, 11\]; weight \[64, 96\] in blocks of 16 x 8 "
                         r"needs \[4, 12\]"),
    (_orphan_scale, "input_layernorm.weight_scale_inv scales no float8 weight"),
    (_integer_scales, "I32; block scales are floating point"),
], ids=["missing-scales", "wrong-block-shape", "orphan-scales", "integer-scales"])
def test_malformed_scales_are_refused_by_name(checkpoints, tmp_path, edit, message):
    plain, _, _ = checkpoints
    write_fp8(plain, tmp_path / "broken", edit=edit)
    with pytest.raises(QuantizationError, match=message):
        load_checkpoint(tmp_path / "broken")


@pytest.mark.parametrize("quantization,error,message", [
    ({"quant_method": "fp8", "weight_block_size": [128]}, QuantizationError, "two positive integers"),
    ({"quant_method": "fp8", "weight_block_size": [16, 0]}, QuantizationError, "two positive integers"),
    ({"quant_method": "fp8"}, QuantizationError, "weight_block_size"),
    ({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": BLOCK}, QuantizationError, "e5m2"),
    ({"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": BLOCK}, QuantizationError, "static"),
    ({"quant_method": "mxfp4"}, UnsupportedCheckpoint, "'mxfp4' is not supported"),
    ("fp8", QuantizationError, "must be an object"),
], ids=["one-dim-block", "zero-block", "no-block", "e5m2", "static", "mxfp4", "not-an-object"])
def test_malformed_quantization_configs_are_refused(checkpoints, tmp_path, quantization, error, message):
    plain, _, _ = checkpoints
    write_fp8(plain, tmp_path / "broken", quantization=quantization)
    with pytest.raises(error, match=message):
        load_checkpoint(tmp_path / "broken")
    assert issubclass(error, CheckpointError)


def test_the_real_block_size_with_partial_blocks(checkpoints, tmp_path):
    """128 x 128 blocks (DeepSeek-V3's) on matrices smaller than one block: one partial block each."""
    plain, _, _ = checkpoints
    dequantized = write_fp8(plain, tmp_path / "real", block=[128, 128])
    recipe = load_checkpoint(tmp_path / "real")
    down = next(w for w in recipe.weights if w.name == "layers.1.down.weight")
    assert torch.equal(down.tensor, dequantized["model.layers.1.mlp.down_proj.weight"])
