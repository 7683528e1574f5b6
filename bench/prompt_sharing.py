"""n choices of one prompt: shared prompt pages against separate prefills, in the same process.

Not a test. Loads a core (default: the tiny fixture core of the test suite), submits n seeded choices
of one P-token prompt at once and runs them to completion, twice: with prefix caching (the choices
share the prompt: `helios.runtime.cache.prompt_sharing`) and without (every choice prefills the prompt, as
before prompt sharing). Prints, per n: prompt tokens computed, prompt pages allocated, the wall time
of each run (the fastest of `--repeats` interleaved runs) and separate / shared, and whether the
tokens agree.

    .venv/bin/python bench/prompt_sharing.py [--prompt-tokens 40] [--choices 1 4] [--device cuda]
        [--core CORE --accept NAMESPACE --trust KEY.pub] [--max-tokens 16]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from helios.core.reader import open_core
from helios.runtime.engine import EngineRequest
from helios.runtime.records.events import FinishEvent, FinishReason, TokenEvent
from helios.runtime.loading.model import LoadOptions
from helios.runtime.execution.packer import AdmissionValues
from helios.runtime.scheduling.policy import SchedulerPolicy
from helios.runtime.records.request import RequestSpec
from helios.runtime.service import RuntimeOptions, build_runtime

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
SAMPLED = (1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0)  # temperature 1, no filter, no penalty


def run(core, device: str, prefix_caching: bool, prompt: tuple[int, ...], n: int, max_tokens: int):
    runtime = build_runtime(core, RuntimeOptions(load=LoadOptions(device=device),
                                                 policy=SchedulerPolicy(prefix_caching=prefix_caching)))
    scheduler, plans = runtime.engine.scheduler, []
    schedule = scheduler.schedule

    def recording():
        plan = schedule()
        if plan is not None:
            plans.append(plan)
        return plan

    scheduler.schedule = recording
    tokens = {f"c{j}": [] for j in range(n)}
    failures = []
    for j in range(n):
        def record(event, out=tokens[f"c{j}"]):
            if isinstance(event, TokenEvent):
                out.extend(event.token_ids)
            elif isinstance(event, FinishEvent) and event.reason not in (FinishReason.EOS, FinishReason.LENGTH):
                failures.append(f"{event.request_id}: {event.reason.name} {event.message}")
        admission = AdmissionValues(prompt, 1000 + j, SAMPLED, max_tokens, ())
        runtime.engine.submit(EngineRequest(RequestSpec(f"c{j}", prompt, max_tokens), admission, record))
    start = time.perf_counter()
    runtime.engine.run_until_idle()
    elapsed = time.perf_counter() - start
    if failures:
        raise SystemExit(f"choices did not finish: {failures} (the core's context or concurrency is too small?)")
    computed = sum(max(0, min(r.start_pos + r.query_len, len(prompt)) - r.start_pos) for p in plans for r in p.rows)
    pages = {page for p in plans for r in p.rows if r.start_pos < len(prompt) for page in r.new_page_ids}
    runtime.close()
    return computed, len(pages), elapsed, [tokens[f"c{j}"] for j in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--core", type=Path, default=FIXTURES / "models" / "tiny_qwen3.core")
    parser.add_argument("--accept")
    parser.add_argument("--trust", type=Path, default=FIXTURES / "cores" / "TEST-ONLY-signing.key.pub")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--prompt-tokens", type=int, default=40)  # the fixture core's context is 64 tokens
    parser.add_argument("--choices", type=int, nargs="+", default=[1, 4])  # and its concurrency 4
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each, interleaved; the fastest is shown")
    args = parser.parse_args()
    accept = args.accept or json.loads((FIXTURES / "models" / "tiny_qwen3.json").read_text())["namespace"]
    core = open_core(args.core, accept=accept, trusted_keys=[args.trust])
    prompt = tuple(3 + i % 200 for i in range(args.prompt_tokens))
    print(f"prompt {len(prompt)} tokens, {args.max_tokens} new tokens per choice, {args.device}")
    print(f"{'n':>3} {'prompt tokens shared/separate':>30} {'pages shared/separate':>22} "
          f"{'time shared/separate (s)':>25} {'separate/shared':>16} same tokens")
    for n in args.choices:
        run(core, args.device, True, prompt, n, 2)  # warm-up (first loads, first programs)
        runs = [(run(core, args.device, True, prompt, n, args.max_tokens),
                 run(core, args.device, False, prompt, n, args.max_tokens)) for _ in range(args.repeats)]
        shared = min((pair[0] for pair in runs), key=lambda r: r[2])  # the least disturbed of the repeats
        separate = min((pair[1] for pair in runs), key=lambda r: r[2])
        print(f"{n:>3} {shared[0]:>14} / {separate[0]:<13} {shared[1]:>10} / {separate[1]:<9} "
              f"{shared[2]:>11.3f} / {separate[2]:<11.3f} {separate[2] / shared[2]:>15.2f}x {shared[3] == separate[3]}")


if __name__ == "__main__":
    main()
