"""Same-process A/B of the CPU decode step's host-side levers (not a test): one loaded engine,
generating the same greedy workload alternately with the previous bodies and the current ones.

The levers swapped (each exact: the same tokens, and the same values for every op):

- the decode group's attention plan computed in numpy over views of the step's CPU tensors
  (`helios.abi.paged_reference._group_host`) instead of a dozen torch calls (`_group_torch`);
- the greedy decision over numpy views, and the argmax over the logits themselves when every
  row's maximum is finite (`helios.abi.sampling_cpu`), instead of host reads of lists, a
  ``nan_to_num`` pass and a ``where``; the unchosen rows cleared through a numpy view;
- the slot plan's least slot read through a numpy view.

Prints thread CPU time per step (prefill included, as `bench/cpu_step_profile.py` counts it) of
each side, best and median of --repeats alternated runs, and their ratio. With --compile-programs
the engine's programs are compiled by Inductor at load (both sides run the compiled segments).

    .venv/bin/python bench/cpu_levers_ab.py [--model embedded|llama4] [--batch 16] [--tokens 64]
        [--repeats 7] [--compile-programs]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from cpu_step_profile import _engine  # noqa: E402

from helios.abi import cpu_bodies, paged_reference, sampling_cpu  # noqa: E402
from helios.runtime.offline import generate  # noqa: E402

_NEG_INF, _F32_MAX = float("-inf"), torch.finfo(torch.float32).max


def _previous_greedy(logits, temperature, penalties, grammar_mask, mask_rows, rows=None):
    """The greedy fast path as it was: lists read on the host, the masks tested by torch calls,
    a nan_to_num pass and a where on every call."""
    chosen = rows.tolist() if rows is not None else None
    for index, (drawn, penalty) in enumerate(zip(temperature.tolist(), penalties.tolist())):
        if (drawn > 0 or penalty != [1.0, 0.0, 0.0]) and (chosen is None or chosen[index]):
            return None
    vocab = logits.shape[1]
    full = vocab // 32
    masked = False
    if not (vocab % 32 == 0 and bool((grammar_mask[:, :full] == -1).all())):
        restricting = mask_rows & ~sampling_cpu.allows_every_token(grammar_mask, vocab)
        masked = bool((restricting & rows if rows is not None else restricting).any())
    values = torch.nan_to_num(logits, nan=_NEG_INF, posinf=_F32_MAX, neginf=_NEG_INF)
    if masked:
        values = values.masked_fill(sampling_cpu.disallowed(grammar_mask, mask_rows, vocab), _NEG_INF)
    best, tokens = values.max(dim=-1)
    return torch.where(best > _NEG_INF, tokens, -1)


CURRENT = {
    (paged_reference, "_group"): paged_reference._group,
    (cpu_bodies, "greedy_tokens_cpu"): cpu_bodies.greedy_tokens_cpu,
    (cpu_bodies, "_unchosen_cleared"): cpu_bodies._unchosen_cleared,
    (cpu_bodies, "_host_min"): cpu_bodies._host_min,
}
PREVIOUS = {
    (paged_reference, "_group"): paged_reference._group_torch,
    (cpu_bodies, "greedy_tokens_cpu"): _previous_greedy,
    (cpu_bodies, "_unchosen_cleared"): lambda tokens, rows: tokens.masked_fill_(~rows, -1),
    (cpu_bodies, "_host_min"): lambda values: values.min(),
}


def _use(side: dict) -> None:
    for (module, name), function in side.items():
        setattr(module, name, function)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded", choices=("embedded", "llama4"))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--compile-programs", action="store_true", help="compile the programs with Inductor at load")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        engine = _engine(args.model, args.batch, args.tokens, Path(scratch), args.compile_programs)
        prompts = [[(b * 13 + i) % 500 + 3 for i in range(8)] for b in range(args.batch)]
        times: dict[str, list[float]] = {"previous": [], "current": []}
        outputs = {}
        for side, bodies in (("previous", PREVIOUS), ("current", CURRENT)):  # warm-up, and the tokens
            _use(bodies)
            outputs[side] = generate(engine, prompts, args.tokens)
        for _ in range(args.repeats):
            for side, bodies in (("previous", PREVIOUS), ("current", CURRENT)):
                _use(bodies)
                started = time.thread_time()
                generate(engine, prompts, args.tokens)
                times[side].append((time.thread_time() - started) / (args.tokens + 1))
        _use(CURRENT)
        same = _tokens(outputs["previous"]) == _tokens(outputs["current"])
        print(f"{args.model}, batch {args.batch}, {args.tokens} tokens, compiled {args.compile_programs}: thread CPU "
              f"time per step, {args.repeats} alternated runs each; same tokens: {same}")
        for side, values in times.items():
            print(f"  {side:9s} best {1e6 * min(values):7.0f} us  median {1e6 * statistics.median(values):7.0f} us")
        print(f"  current / previous: best {min(times['current']) / min(times['previous']):.3f}, "
              f"median {statistics.median(times['current']) / statistics.median(times['previous']):.3f}")


def _tokens(results) -> list:
    return [list(getattr(result, "token_ids", result)) for result in results]


if __name__ == "__main__":
    main()
