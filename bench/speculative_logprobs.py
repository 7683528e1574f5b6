"""What log-probabilities and logit bias cost under speculation: SPECULATIVE programs' token-logprobs
twins and their bias inputs against plain speculation and against plain decoding with the same
requests (what such a lane did before: its whole cohort decoded plainly), same process, same
weights, captured programs.

Writes a random Llama-shaped bf16 checkpoint (`bench/random_llama.py`: 8B layer shapes and the
128,256-token vocabulary, whose full-vocabulary log-softmax and sort the twins run for every verified
position; `--layers` of them) and prepares one core with itself as draft (widths 1 and W, so every
greedy draft is accepted and each round emits W tokens) and token-logprobs variants. Loads it twice:
with speculation, and with `SchedulerPolicy(speculative=False)` (plain decoding). For each batch, the
same greedy workload runs six ways, alternating, best of `--repeats`:

    plain            plain decoding
    plain+logprobs   plain decoding, `top_logprobs` K (the DECODE token-logprobs programs)
    plain+bias       plain decoding, every request with a logit bias (a nudge and a ban)
    spec             speculative rounds
    spec+logprobs    speculative rounds through the SPECULATIVE twins, `top_logprobs` K
    spec+bias        speculative rounds, every request with that bias

and prints output tokens per second with ratios: spec+logprobs / spec (the twins' cost),
spec+logprobs / plain+logprobs (what the twins gain over decoding such lanes plainly), and the
same two for the bias. Every
configuration's tokens are compared with plain decoding's (greedy; bf16 products of other shapes may
flip a near tie, so the differing requests are counted, not refused). `--smoke` runs a tiny shape on
the CPU (the script's own check).

    python3 bench/speculative_logprobs.py [--layers 4] [--batches 1,16,64] [--width 4] [--top 5]
                                          [--tokens 128] [--repeats 3] [--smoke]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from helios.contract import StartupOptions  # noqa: E402
from helios.core.keys import SigningKey  # noqa: E402
from helios.core.reader import open_core  # noqa: E402
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core  # noqa: E402
from helios.ignition.speculative_plan import SpeculativePlan  # noqa: E402
from helios.runtime.engine import EngineRequest  # noqa: E402
from helios.runtime.loading.model import LoadOptions  # noqa: E402
from helios.runtime.records.events import TokenEvent  # noqa: E402
from helios.runtime.records.request import RequestSpec  # noqa: E402
from helios.runtime.scheduling.policy import SchedulerPolicy  # noqa: E402
from helios.runtime.service import RuntimeOptions, build_runtime  # noqa: E402
from random_llama import LlamaShape, with_layers, write_random_llama  # noqa: E402
from speculative.support import Counting  # noqa: E402

NAMESPACE = "bench/speculative-logprobs"
PROMPT_TOKENS = 64
BIAS = ((7, 3.0), (11, -100.0))  # a nudge and a ban
SMOKE = LlamaShape(hidden_size=128, intermediate_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                   vocab_size=512, max_position_embeddings=1024)


def run(engine, prompts, tokens: int, top: int | None, bias=()) -> list[list[int]]:
    """Every prompt submitted before the first step, run to completion; each prompt's tokens."""
    outputs: dict[str, list[int]] = {}

    def record(event) -> None:
        if isinstance(event, TokenEvent):
            outputs[event.request_id].extend(event.token_ids)

    for index, prompt in enumerate(prompts):
        request_id = f"bench-{index}"
        outputs[request_id] = []
        engine.submit(EngineRequest(RequestSpec(request_id, tuple(prompt), tokens, top_logprobs=top,
                                                 logit_bias=bias), record))
    engine.run_until_idle()
    return [outputs[f"bench-{index}"] for index in range(len(prompts))]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4, help="decoder layers of the 8B-shaped target (default 4)")
    parser.add_argument("--batches", default="1,16,64", type=lambda s: tuple(int(x) for x in s.split(",")),
                        help="decode batch sizes, comma-separated (default 1,16,64)")
    parser.add_argument("--width", type=int, default=4, help="speculative width W (default 4)")
    parser.add_argument("--top", type=int, default=5, help="top_logprobs K of the logprobs runs (default 5)")
    parser.add_argument("--tokens", type=int, default=128, help="greedy output tokens per request (default 128)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per configuration, best kept (default 3)")
    parser.add_argument("--smoke", action="store_true", help="a tiny shape on the CPU (checks the script)")
    args = parser.parse_args()
    if not (args.smoke or torch.cuda.is_available()):
        sys.exit("bench/speculative_logprobs.py: needs a CUDA device (or --smoke)")
    device = torch.device("cpu" if args.smoke else "cuda")
    shape = with_layers(SMOKE if args.smoke else LlamaShape(), args.layers)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        checkpoint = write_random_llama(root / "target", shape)
        key = SigningKey.generate()
        context = PROMPT_TOKENS + args.tokens + 2 * args.width
        plan = CapacityPlan(page_tokens=16, context_tokens=context, prefill_tokens=min(256, context),
                            decode_batches=args.batches, prefill_batches=(1,), mixed=False,
                            page_capacity=max(args.batches) * -(-context // 16) + 64,
                            speculative=SpeculativePlan(checkpoint, widths=(1, args.width)), token_logprobs=True)
        started = time.perf_counter()
        prepare_core(checkpoint, root / "model.core", key, PrepareOptions(NAMESPACE, dtype="bfloat16", capacities=plan))
        size = "a tiny" if args.smoke else "the 8B"
        print(f"{args.layers} layers of {size} shape, vocabulary {shape.vocab_size}, self-draft W={args.width}: "
              f"prepared in {time.perf_counter() - started:.0f} s", flush=True)
        runtimes = {}
        for name, policy in (("spec", SchedulerPolicy()), ("plain", SchedulerPolicy(speculative=False))):
            load = LoadOptions(StartupOptions(), device=str(device), cuda_graphs=device.type == "cuda")
            opened = open_core(root / "model.core", accept=NAMESPACE, trusted_keys=[key.public])
            runtimes[name] = build_runtime(opened, RuntimeOptions(load=load, policy=policy))
        generator = torch.Generator().manual_seed(0)
        configs = (("plain", "plain", None, ()), ("plain+logprobs", "plain", args.top, ()),
                   ("plain+bias", "plain", None, BIAS), ("spec", "spec", None, ()),
                   ("spec+logprobs", "spec", args.top, ()), ("spec+bias", "spec", None, BIAS))
        for batch in args.batches:
            prompts = torch.randint(3, 300, (batch, PROMPT_TOKENS), generator=generator).tolist()
            for runtime in runtimes.values():
                run(runtime.engine, prompts, 8, None)  # warm-up
                run(runtime.engine, prompts, 8, args.top)
                run(runtime.engine, prompts, 8, None, BIAS)
            best = dict.fromkeys(label for label, *_ in configs)
            rounds: dict[str, float] = {}
            expected: dict[bool, list] = {}
            differing: dict[str, int] = {}
            for repeat in range(args.repeats):
                for label, name, top, bias in configs:
                    engine = runtimes[name].engine
                    counting = Counting()
                    counting.wrap(engine.executor)
                    synchronize(device)
                    started = time.perf_counter()
                    outputs = run(engine, prompts, args.tokens, top, bias)
                    synchronize(device)
                    elapsed = time.perf_counter() - started
                    counting.stop()
                    del engine.executor.finish  # the executor's own finish again
                    reference = expected.setdefault(bool(bias), outputs)  # plain's (biased: plain+bias's)
                    differing[label] = sum(a != b for a, b in zip(outputs, reference))
                    rate = sum(map(len, outputs)) / elapsed
                    best[label] = max(best[label] or 0.0, rate)
                    rounds[label] = counting.rounds
            print(f"batch {batch}, {args.tokens} greedy tokens per request, top_logprobs {args.top}:", flush=True)
            for label, *_ in configs:
                print(f"  {label:<16} {best[label]:10.1f} tok/s   speculative rounds {rounds[label]:6.0f}   "
                      f"requests whose tokens differ from plain's: {differing[label]}")
            print(f"  spec+logprobs / spec           {best['spec+logprobs'] / best['spec']:.3f}x")
            print(f"  spec+logprobs / plain+logprobs {best['spec+logprobs'] / best['plain+logprobs']:.3f}x")
            print(f"  plain+logprobs / plain         {best['plain+logprobs'] / best['plain']:.3f}x")
            print(f"  spec+bias / spec               {best['spec+bias'] / best['spec']:.3f}x")
            print(f"  spec+bias / plain+bias         {best['spec+bias'] / best['plain+bias']:.3f}x", flush=True)
        for runtime in runtimes.values():
            runtime.close()


if __name__ == "__main__":
    main()
