"""Random Llama-shaped checkpoints for benchmarks, written straight to safetensors in their dtype.

`write_random_llama(directory, shape)` writes config.json, one safetensors file per layer (plus
one for the embeddings, final norm and head) and the frontend files of the tests' tiny chat
tokenizer (prompts in benchmarks are token ids, so its small vocabulary does not matter). Weights
are drawn per tensor with a fixed seed in bf16/fp16/fp32 directly, scaled by 0.02 (norm weights
are ones), so an 8B-shaped checkpoint never exists in float32 and never in memory as a whole.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.chat_checkpoint import write_frontend_files  # noqa: E402


@dataclass(frozen=True)
class LlamaShape:
    hidden_size: int = 4096
    intermediate_size: int = 14336
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    rope_theta: float = 500000.0
    max_position_embeddings: int = 131072

    def parameters(self) -> int:
        attention = self.hidden_size * self.head_dim * (2 * self.num_attention_heads + 2 * self.num_key_value_heads)
        layer = attention + 3 * self.hidden_size * self.intermediate_size + 2 * self.hidden_size
        return self.num_hidden_layers * layer + 2 * self.vocab_size * self.hidden_size + self.hidden_size

    def kv_bytes_per_token(self, element_bytes: int) -> int:
        return self.num_hidden_layers * 2 * self.num_key_value_heads * self.head_dim * element_bytes


LLAMA_31_8B = LlamaShape()
SMOKE = LlamaShape(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
                   num_key_value_heads=4, head_dim=32, vocab_size=512, rope_theta=10000.0, max_position_embeddings=4096)


def with_layers(shape: LlamaShape, layers: int) -> LlamaShape:
    return replace(shape, num_hidden_layers=layers)


def write_random_llama(directory: Path, shape: LlamaShape, dtype: torch.dtype = torch.bfloat16, seed: int = 0,
                       progress=lambda line: None, device: str = "cpu") -> Path:
    """Writes the checkpoint (see the module docstring) and returns `directory`. `device` draws the
    numbers there (a GPU draws 16 GB in seconds); the same seed gives the same weights per device."""
    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator(device=device).manual_seed(seed)
    weight_map: dict[str, str] = {}

    def weight(*size: int) -> torch.Tensor:
        drawn = torch.randn(*size, generator=generator, dtype=torch.float32, device=device) * 0.02
        return drawn.to(dtype).cpu()

    hidden, heads, kv_heads, head_dim = shape.hidden_size, shape.num_attention_heads, shape.num_key_value_heads, shape.head_dim
    for layer in range(shape.num_hidden_layers):
        prefix = f"model.layers.{layer}."
        tensors = {
            prefix + "self_attn.q_proj.weight": weight(heads * head_dim, hidden),
            prefix + "self_attn.k_proj.weight": weight(kv_heads * head_dim, hidden),
            prefix + "self_attn.v_proj.weight": weight(kv_heads * head_dim, hidden),
            prefix + "self_attn.o_proj.weight": weight(hidden, heads * head_dim),
            prefix + "mlp.gate_proj.weight": weight(shape.intermediate_size, hidden),
            prefix + "mlp.up_proj.weight": weight(shape.intermediate_size, hidden),
            prefix + "mlp.down_proj.weight": weight(hidden, shape.intermediate_size),
            prefix + "input_layernorm.weight": torch.ones(hidden, dtype=dtype),
            prefix + "post_attention_layernorm.weight": torch.ones(hidden, dtype=dtype),
        }
        save_file(tensors, str(directory / f"layer-{layer:03d}.safetensors"))
        weight_map.update(dict.fromkeys(tensors, f"layer-{layer:03d}.safetensors"))
        progress(f"checkpoint: layer {layer + 1}/{shape.num_hidden_layers}")
    outer = {
        "model.embed_tokens.weight": weight(shape.vocab_size, hidden),
        "model.norm.weight": torch.ones(hidden, dtype=dtype),
        "lm_head.weight": weight(shape.vocab_size, hidden),
    }
    save_file(outer, str(directory / "embeddings.safetensors"))
    weight_map.update(dict.fromkeys(outer, "embeddings.safetensors"))
    index = {"metadata": {}, "weight_map": weight_map}  # the sharded layout transformers reads
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    write_frontend_files(directory)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", **asdict(shape),
        "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False,
        "attention_bias": False, "mlp_bias": False, "bos_token_id": 0, "eos_token_id": 1,
        "torch_dtype": str(dtype).removeprefix("torch."), "initializer_range": 0.02,
    }
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    return directory
