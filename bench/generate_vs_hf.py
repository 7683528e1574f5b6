"""CPU decode throughput of Helios against Hugging Face `generate` on the same weights, same process.

For each model (default: the embedded default model and a 4-layer random Llama from
`bench/random_llama.py`; or `--checkpoint DIR`) the checkpoint is prepared into a core in --dtype
(float32 by default, the dtype transformers runs in here too), then for each batch size the same
greedy workload (8-token prompts, --tokens outputs each) runs through the Helios runtime
(`helios.runtime.offline.generate`, the engine driven in this thread) and through transformers'
`generate`, interleaved, --repeats times each; the best run of each is reported as output tokens
per second, with the ratio Helios / transformers (wall clock) and the same ratio of process CPU
time per token (steadier on a shared machine). Both use the same torch thread count (--threads).
"same" counts requests whose Helios tokens equal transformers' greedy tokens; "target" is issue
#18's goal for the ratio (1.0x at batch 1, 1.5x at batch 16).

    .venv/bin/python bench/generate_vs_hf.py [--models embedded,llama4] [--checkpoint DIR]
        [--batches 1,16] [--tokens 64] [--threads 1] [--repeats 5] [--dtype float32]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from random_llama import SMOKE, with_layers, write_random_llama  # noqa: E402

from helios.core.keys import SigningKey  # noqa: E402
from helios.core.reader import open_core  # noqa: E402
from helios.embedded import default_model_dir  # noqa: E402
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core  # noqa: E402
from helios.runtime.offline import generate  # noqa: E402
from helios.runtime.service import build_runtime  # noqa: E402

NAMESPACE = "bench/hf"
PROMPT_TOKENS = 8
TARGETS = {1: "1.0x", 16: "1.5x"}  # issue #18's CPU row: Helios / transformers


@dataclass
class Best:
    """The fastest of several timed runs: wall and process CPU seconds per output token."""

    wall: float = float("inf")
    cpu: float = float("inf")

    def update(self, wall: float, cpu: float, tokens: int) -> None:
        self.wall, self.cpu = min(self.wall, wall / tokens), min(self.cpu, cpu / tokens)


def timed(run) -> tuple[float, float, object]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = run()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def helios_run(engine, prompts, tokens: int) -> tuple[int, list[list[int]]]:
    results = generate(engine, prompts, tokens)
    return sum(len(r.token_ids) for r in results), [list(r.token_ids) for r in results]


def hf_run(model, prompts, tokens: int) -> tuple[int, list[list[int]]]:
    ids = torch.tensor(prompts)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens,
                             min_new_tokens=tokens, do_sample=False, pad_token_id=0)
    generated = out[:, ids.shape[1]:]
    return generated.numel(), generated.tolist()


def compare(name: str, checkpoint: Path, scratch: Path, args, batches: list[int]) -> None:
    key = SigningKey.generate()
    core = scratch / f"{name}.core"
    plan = CapacityPlan(context_tokens=PROMPT_TOKENS + args.tokens + 8, prefill_tokens=64,
                        decode_batches=tuple(sorted(set(batches))))
    prepare_core(checkpoint, core, key, PrepareOptions(NAMESPACE, capacities=plan, dtype=args.dtype))
    engine = build_runtime(open_core(core, accept=NAMESPACE, trusted_keys=[key.public])).engine
    model = transformers.AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=getattr(torch, args.dtype)).eval()
    vocab = model.config.vocab_size
    for batch in batches:
        prompts = [[(b * 13 + i) % (vocab - 3) + 3 for i in range(PROMPT_TOKENS)] for b in range(batch)]
        helios_run(engine, prompts[:1], 4)  # warm-up
        hf_run(model, prompts[:1], 4)
        ours, theirs = Best(), Best()
        for _ in range(args.repeats):
            wall, cpu, (count, our_tokens) = timed(lambda: helios_run(engine, prompts, args.tokens))
            ours.update(wall, cpu, count)
            wall, cpu, (count, their_tokens) = timed(lambda: hf_run(model, prompts, args.tokens))
            theirs.update(wall, cpu, count)
        same = sum(a == b for a, b in zip(our_tokens, their_tokens))
        target = TARGETS.get(batch, "-")
        print(f"{name:9s} {batch:5d}  {1 / ours.wall:12.1f}  {1 / theirs.wall:18.1f}  {theirs.wall / ours.wall:5.2f}"
              f"  {theirs.cpu / ours.cpu:9.2f}  {same:3d}/{batch}  {target:>6s}", flush=True)


def checkpoints(args, scratch: Path) -> list[tuple[str, Path]]:
    if args.checkpoint is not None:
        return [(args.checkpoint.name[:9], args.checkpoint)]
    chosen = []
    for name in args.models.split(","):
        if name == "embedded":
            chosen.append((name, default_model_dir()))
        elif name == "llama4":
            chosen.append((name, write_random_llama(scratch / "llama4", with_layers(SMOKE, 4), torch.float32)))
        else:
            raise SystemExit(f"unknown model {name!r} (embedded, llama4)")
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="embedded,llama4", help="comma-separated: embedded, llama4")
    parser.add_argument("--checkpoint", type=Path, help="a Hugging Face checkpoint directory instead of --models")
    parser.add_argument("--batches", default="1,16", help="comma-separated batch sizes")
    parser.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (both)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each, interleaved; best reported")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="both run in it")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as scratch:
        chosen = checkpoints(args, Path(scratch))
        print(f"torch {torch.__version__}, transformers {transformers.__version__}, {args.threads} thread(s), "
              f"{args.dtype}, {args.tokens} tokens per request, greedy, best of {args.repeats}")
        print("model     batch  helios tok/s  transformers tok/s  ratio  cpu ratio  same  target")
        for name, checkpoint in chosen:
            compare(name, checkpoint, Path(scratch), args, batches)


if __name__ == "__main__":
    main()
