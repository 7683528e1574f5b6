"""Speculative generation against plain decode, same process, same weights, captured programs.

Builds a random Llama-shaped target (default hidden 512, 8 layers, heads of 64, MLP 3x hidden, the
test chat tokenizer's 320 tokens) whose layers after the second are scaled down, so that a truncated copy of its first two
layers agrees with it often, as a distilled draft would. Prepares cores with `prepare_core`:
the target alone (plain decode), the target with itself as draft, and the target with the
truncated draft (widths 1 and W). Then, for each batch size, runs the same greedy workload through
`helios.runtime.offline.generate` and prints output tokens per second, the speed-up against plain
decode, and the tokens each speculative lane emitted per round (accepted drafts + 1). Finally a
copy-heavy prompt (a passage, then its start again) with and without history drafting.

    .venv/bin/python bench/speculative.py [--batches 1,4] [--tokens 64] [--width 4] [--threads 1]
                                          [--hidden 512] [--layers 8]

Greedy outputs of every configuration are checked against plain decode (they must be identical).
Rates are the best of three runs (the machine may be shared); round counts are from the first.
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

from helios.contract import StartupOptions  # noqa: E402
from helios.core.keys import SigningKey  # noqa: E402
from helios.core.reader import open_core  # noqa: E402
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core  # noqa: E402
from helios.ignition.speculative_plan import SpeculativePlan  # noqa: E402
from helios.runtime.loading.model import LoadOptions  # noqa: E402
from helios.runtime.offline import generate  # noqa: E402
from helios.runtime.service import RuntimeOptions, build_runtime  # noqa: E402
from ignition.hf_checkpoints import LLAMA2, random_model  # noqa: E402
from speculative.support import Counting, write_truncated_checkpoint  # noqa: E402
from support.chat_checkpoint import VOCAB_SIZE, write_frontend_files  # noqa: E402

NAMESPACE = "bench/speculative"
KEPT_LAYERS = 2
LATE_LAYER_SCALE = 0.15  # output projections of layers >= KEPT_LAYERS


def write_target(directory: Path, hidden: int, layers: int) -> Path:
    shape = (("vocab_size", VOCAB_SIZE), ("hidden_size", hidden), ("intermediate_size", 3 * hidden),
             ("num_hidden_layers", layers), ("num_attention_heads", hidden // 64), ("num_key_value_heads", hidden // 128),
             ("attention_bias", False), ("mlp_bias", False), ("max_position_embeddings", 1024))
    family = type(LLAMA2)("bench", LLAMA2.config_class, LLAMA2.overrides + shape)
    model = random_model(family, seed=11)
    with torch.no_grad():
        for layer in model.model.layers[KEPT_LAYERS:]:
            layer.self_attn.o_proj.weight.mul_(LATE_LAYER_SCALE)
            layer.mlp.down_proj.weight.mul_(LATE_LAYER_SCALE)
    model.save_pretrained(directory)
    write_frontend_files(directory)
    return directory


def prepare(checkpoint: Path, draft: Path | None, root: Path, key: SigningKey, name: str, args) -> Path:
    speculative = None if draft is None else SpeculativePlan(draft, widths=(1, args.width))
    plan = CapacityPlan(page_tokens=16, context_tokens=512, prefill_tokens=128, decode_batches=args.batches,
                        mixed=False, speculative=speculative)
    started = time.perf_counter()
    prepare_core(checkpoint, root / f"{name}.core", key, PrepareOptions(NAMESPACE, capacities=plan))
    print(f"  prepared {name} in {time.perf_counter() - started:.0f} s", flush=True)
    return root / f"{name}.core"


def measure(core: Path, key: SigningKey, prompts, tokens: int, startup: StartupOptions = StartupOptions(),
            repeats: int = 3):
    """(best output tokens per second of `repeats` runs, speculative counts of one run, outputs)."""
    runtime = build_runtime(open_core(core, accept=NAMESPACE, trusted_keys=[key.public]),
                            RuntimeOptions(load=LoadOptions(startup=startup)))
    generate(runtime.engine, prompts[:1], 4)  # warm-up
    counting = Counting()
    counting.wrap(runtime.engine.executor)
    best = 0.0
    for repeat in range(repeats):
        started = time.perf_counter()
        results = generate(runtime.engine, prompts, tokens)
        elapsed = time.perf_counter() - started
        outputs = [list(r.token_ids) for r in results]
        best = max(best, sum(map(len, outputs)) / elapsed)
        counting.stop()  # counts of the first run
    return best, counting, outputs


def report(label: str, rate: float, base: float, counting: Counting | None) -> None:
    per_round = f"{counting.tokens_per_lane:5.2f}" if counting is not None and counting.rounds else "    -"
    print(f"  {label:<34} {rate:8.1f} tok/s   x{rate / base:5.2f}   tokens/lane/round {per_round}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,4", type=lambda s: tuple(int(x) for x in s.split(",")))
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--width", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=512, help="target hidden size (heads of 64, MLP 3x)")
    parser.add_argument("--layers", type=int, default=8, help="target layers")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        key = SigningKey.generate()
        target = write_target(root / "target", args.hidden, args.layers)
        print(f"target: hidden {args.hidden}, {args.layers} layers (layers >= {KEPT_LAYERS} scaled by "
              f"{LATE_LAYER_SCALE}); draft: its first {KEPT_LAYERS} layers", flush=True)
        truncated = write_truncated_checkpoint(target, root / "draft", KEPT_LAYERS)
        cores = {"plain decode": prepare(target, None, root, key, "plain", args),
                 f"self-draft W={args.width}": prepare(target, target, root, key, "self", args),
                 f"{KEPT_LAYERS}-layer draft W={args.width}": prepare(target, truncated, root, key, "truncated", args)}
        generator = torch.Generator().manual_seed(0)
        for batch in args.batches:
            prompts = torch.randint(3, VOCAB_SIZE, (batch, 16), generator=generator).tolist()
            print(f"batch {batch}, {args.tokens} greedy tokens per request, {args.threads} thread(s):")
            base, _, expected = measure(cores["plain decode"], key, prompts, args.tokens)
            report("plain decode", base, base, None)
            for label, core in list(cores.items())[1:]:
                rate, counting, outputs = measure(core, key, prompts, args.tokens)
                assert outputs == expected, f"{label}: output differs from plain decode"
                report(label, rate, base, counting)
        history(cores, key, args, generator)


def history(cores, key: SigningKey, args, generator) -> None:
    passage = torch.randint(3, VOCAB_SIZE, (48,), generator=generator).tolist()
    prompts = [passage + passage[:12]]
    print(f"copy-heavy prompt (48-token passage, then its first 12 again), {args.tokens * 2} tokens:")
    base, _, expected = measure(cores["plain decode"], key, prompts, args.tokens * 2)
    report("plain decode", base, base, None)
    core = cores[f"{KEPT_LAYERS}-layer draft W={args.width}"]
    for label, startup in (("learned draft only", StartupOptions()),
                           ("learned draft + history drafting", StartupOptions(history_drafting=True))):
        rate, counting, outputs = measure(core, key, prompts, args.tokens * 2, startup)
        assert outputs == expected, f"{label}: output differs from plain decode"
        report(label, rate, base, counting)


if __name__ == "__main__":
    main()
