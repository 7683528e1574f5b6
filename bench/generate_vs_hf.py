"""Decode throughput of Helios against Hugging Face `generate` on the same weights, same process.

Prepares CHECKPOINT (default: a random Qwen3-shaped model, hidden 256, 4 layers, built here) into a
core, then for each batch size runs the same greedy workload (8-token prompts, --tokens outputs)
through the Helios runtime (`helios.runtime.offline.generate`) and through transformers'
`generate`, and prints output tokens per second for both and their ratio.

    .venv/bin/python bench/generate_vs_hf.py [--checkpoint DIR] [--batches 1,16] [--tokens 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helios.core.keys import SigningKey  # noqa: E402
from helios.core.reader import open_core  # noqa: E402
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core  # noqa: E402
from helios.runtime.offline import generate  # noqa: E402
from helios.runtime.service import build_runtime  # noqa: E402
from ignition.hf_checkpoints import QWEN3  # noqa: E402
from support.chat_checkpoint import write_chat_checkpoint  # noqa: E402

BENCH_SHAPE = (("hidden_size", 256), ("intermediate_size", 768), ("num_hidden_layers", 4),
               ("num_attention_heads", 8), ("num_key_value_heads", 4), ("head_dim", 32))


def helios_rate(core: Path, key: SigningKey, prompts, tokens: int) -> float:
    runtime = build_runtime(open_core(core, accept="bench/hf", trusted_keys=[key.public]))
    generate(runtime.engine, prompts[:1], 4)  # warm-up
    start = time.perf_counter()
    results = generate(runtime.engine, prompts, tokens)
    elapsed = time.perf_counter() - start
    return sum(len(r.token_ids) for r in results) / elapsed


def hf_rate(checkpoint: Path, prompts, tokens: int) -> float:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(checkpoint)).float().eval()
    ids = torch.tensor(prompts)
    with torch.no_grad():
        model.generate(ids[:1], attention_mask=torch.ones_like(ids[:1]), max_new_tokens=4, do_sample=False)
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, min_new_tokens=tokens,
                             do_sample=False, pad_token_id=0)
        elapsed = time.perf_counter() - start
    return (out.shape[1] - ids.shape[1]) * ids.shape[0] / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, help="Hugging Face checkpoint directory (default: a random one)")
    parser.add_argument("--batches", default="1,16", help="comma-separated batch sizes")
    parser.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    key = SigningKey.generate()
    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = args.checkpoint
        if checkpoint is None:
            family = type(QWEN3)(QWEN3.name, QWEN3.config_class, QWEN3.overrides + BENCH_SHAPE)
            checkpoint = write_chat_checkpoint(family, Path(scratch) / "ckpt", seed=0)
        core = Path(scratch) / "bench.core"
        plan = CapacityPlan(context_tokens=8 + args.tokens + 8, prefill_tokens=64, decode_batches=tuple(sorted(set(batches))))
        prepare_core(checkpoint, core, key, PrepareOptions("bench/hf", capacities=plan))
        print(f"torch {torch.__version__}, {args.threads} thread(s), {args.tokens} tokens per request, greedy")
        print("batch  helios tok/s  transformers tok/s  ratio")
        for batch in batches:
            prompts = [[(b * 13 + i) % 250 + 3 for i in range(8)] for b in range(batch)]
            ours, theirs = helios_rate(core, key, prompts, args.tokens), hf_rate(checkpoint, prompts, args.tokens)
            print(f"{batch:5d}  {ours:12.1f}  {theirs:18.1f}  {ours / theirs:5.2f}")


if __name__ == "__main__":
    main()
