"""Random Qwen3-MoE-shaped checkpoints for benchmarks, written straight to safetensors in their dtype.

`write_random_qwen3_moe(directory, shape)` writes config.json, one safetensors file per layer (per
expert tensors named as Hugging Face stores them) plus one for the embeddings, final norm and head,
and the tests' tiny chat tokenizer files (benchmarks submit token ids). Weights are drawn per tensor
with a fixed seed (scaled by 0.02; norms are ones), never as a whole model in float32.
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
class MoeShape:
    """Qwen3-30B-A3B's geometry (48 layers there); `num_hidden_layers` is what a benchmark writes."""

    hidden_size: int = 2048
    moe_intermediate_size: int = 768
    num_experts: int = 128
    num_experts_per_tok: int = 8
    num_hidden_layers: int = 8
    num_attention_heads: int = 32
    num_key_value_heads: int = 4
    head_dim: int = 128
    vocab_size: int = 151936
    rope_theta: float = 1000000.0
    max_position_embeddings: int = 40960

    def attention_parameters(self) -> int:
        """Per layer: q/k/v/o projections, q/k norms, both layer norms and the router."""
        projections = self.hidden_size * self.head_dim * (2 * self.num_attention_heads + 2 * self.num_key_value_heads)
        return projections + 2 * self.head_dim + 2 * self.hidden_size + self.num_experts * self.hidden_size

    def expert_parameters(self) -> int:
        return 3 * self.hidden_size * self.moe_intermediate_size

    def parameters(self) -> int:
        per_layer = self.attention_parameters() + self.num_experts * self.expert_parameters()
        return self.num_hidden_layers * per_layer + 2 * self.vocab_size * self.hidden_size + self.hidden_size

    def kv_bytes_per_token(self, element_bytes: int) -> int:
        return self.num_hidden_layers * 2 * self.num_key_value_heads * self.head_dim * element_bytes


QWEN3_30B_A3B = MoeShape()
SMOKE = MoeShape(hidden_size=128, moe_intermediate_size=64, num_experts=8, num_experts_per_tok=2, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=512, rope_theta=10000.0,
                 max_position_embeddings=4096)


def with_layers(shape: MoeShape, layers: int) -> MoeShape:
    return replace(shape, num_hidden_layers=layers)


def write_random_qwen3_moe(directory: Path, shape: MoeShape, dtype: torch.dtype = torch.bfloat16, seed: int = 0,
                           progress=lambda line: None, device: str = "cpu") -> Path:
    """Writes the checkpoint (see the module docstring) and returns `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator(device=device).manual_seed(seed)
    weight_map: dict[str, str] = {}

    def weight(*size: int) -> torch.Tensor:
        return (torch.randn(*size, generator=generator, dtype=torch.float32, device=device) * 0.02).to(dtype).cpu()

    def save(tensors: dict, name: str) -> None:
        save_file(tensors, str(directory / name))
        weight_map.update(dict.fromkeys(tensors, name))

    hidden, ffn = shape.hidden_size, shape.moe_intermediate_size
    for layer in range(shape.num_hidden_layers):
        prefix = f"model.layers.{layer}."
        tensors = _attention(shape, prefix, weight, dtype)
        tensors[prefix + "mlp.gate.weight"] = weight(shape.num_experts, hidden)
        for expert in range(shape.num_experts):
            name = f"{prefix}mlp.experts.{expert}."
            tensors[name + "gate_proj.weight"] = weight(ffn, hidden)
            tensors[name + "up_proj.weight"] = weight(ffn, hidden)
            tensors[name + "down_proj.weight"] = weight(hidden, ffn)
        save(tensors, f"layer-{layer:03d}.safetensors")
        progress(f"checkpoint: layer {layer + 1}/{shape.num_hidden_layers}")
    save({"model.embed_tokens.weight": weight(shape.vocab_size, hidden), "model.norm.weight": torch.ones(hidden, dtype=dtype),
          "lm_head.weight": weight(shape.vocab_size, hidden)}, "embeddings.safetensors")
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    write_frontend_files(directory)
    config = {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", **asdict(shape),
        "intermediate_size": 6144, "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
        "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False,
        "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": str(dtype).removeprefix("torch."),
        "initializer_range": 0.02,
    }
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    return directory


def _attention(shape: MoeShape, prefix: str, weight, dtype) -> dict[str, torch.Tensor]:
    hidden, heads, kv_heads, head_dim = shape.hidden_size, shape.num_attention_heads, shape.num_key_value_heads, shape.head_dim
    attn = prefix + "self_attn."
    return {
        attn + "q_proj.weight": weight(heads * head_dim, hidden),
        attn + "k_proj.weight": weight(kv_heads * head_dim, hidden),
        attn + "v_proj.weight": weight(kv_heads * head_dim, hidden),
        attn + "o_proj.weight": weight(hidden, heads * head_dim),
        attn + "q_norm.weight": torch.ones(head_dim, dtype=dtype),
        attn + "k_norm.weight": torch.ones(head_dim, dtype=dtype),
        prefix + "input_layernorm.weight": torch.ones(hidden, dtype=dtype),
        prefix + "post_attention_layernorm.weight": torch.ones(hidden, dtype=dtype),
    }
