"""Host time before the first launch of a cold prefill, phase by phase, without a profiler.

Each cold request (a distinct 2,048-token prompt, one greedy token) is timed with `perf_counter`
marks at the engine's seams, which every tree of the project has (`Scheduler.submit` and
`schedule`, `Packer.pack`, the executor's program call), and, on CUDA, with two events around the
program call (the program's device time):

    admit     request start -> the scheduler's submit returned (spec, engine ingress, admission checks)
    schedule  the scheduler's plan (prefix lookup, digests, pages, slot)
    prepack   the executor's launch up to packing (the packer's apply, cache copies, grammar masks)
    pack      the packer: per-step values, admission values, staging and its host->device copies
    call      the rest up to the program call (submission id), then the call itself (graph launch)
    host      request start -> the program call: the host time the device waits for
    device    the program's device time (CUDA events before and after the call)
    ttft      request start -> the first token's event

Two trees can be compared in one device call: each runs this script in its own process (the
second with PYTHONPATH naming the other tree's `src`), each prepares and loads its own core, and
they take turns request by request through a baton file (`--baton FILE --role a|b`), so both are
measured alternately on the same device, warm, while the other one waits.

    python bench/ttft_host.py [--layers 32] [--repeats 9] [--json out.json]
    python bench/ttft_host.py --smoke --vocab 128256 --prompt 2048 --staged   # host phases on the CPU
    python bench/ttft_host.py --fresh-ab 7   # then 7 + 7 requests, fresh-chunk graphs on / off, alternating
    python bench/ttft_host.py --baton DIR/baton --role a --label ttft3 &  \
      PYTHONPATH=$MAIN_TREE/src:... python bench/ttft_host.py --baton DIR/baton --role b --label main
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_serving import NAMESPACE, log, submit_greedy  # noqa: E402
from random_llama import LLAMA_31_8B, SMOKE, with_layers, write_random_llama  # noqa: E402
from ttft_breakdown import prepared_core, prompt, reused_core  # noqa: E402

from helios.contract import StartupOptions  # noqa: E402
from helios.core.keys import SigningKey, write_key_pair  # noqa: E402
from helios.core.reader import open_core  # noqa: E402
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core  # noqa: E402
from helios.contract import manifest_pb2 as mpb  # noqa: E402
from helios.runtime.loading.model import LoadOptions  # noqa: E402
from helios.runtime.records.events import TokenEvent  # noqa: E402
from helios.runtime.service import RuntimeOptions, build_runtime  # noqa: E402

PHASES = ("admit", "schedule", "prepack", "pack", "call", "launch", "host", "device", "ttft", "gc_before")


class Marks:
    """Wraps the engine's seams (on the instances) and records when each was entered and left."""

    def __init__(self, engine, cuda: bool):
        self.at: dict[str, float] = {}
        self.gc = GcWatch()
        self.events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if cuda else None
        scheduler, executor = engine.scheduler, engine.executor
        self._wrap(scheduler, "submit", "admit")
        self._wrap(scheduler, "schedule", "schedule")
        self._wrap(executor.packer, "pack", "pack")
        self._wrap_call(executor)

    def _wrap(self, owner, name: str, label: str) -> None:
        function = getattr(owner, name)
        marks = self.at

        def wrapped(*args, **kwargs):
            marks.setdefault(f"{label}<", time.perf_counter())
            try:
                return function(*args, **kwargs)
            finally:
                marks.setdefault(f"{label}>", time.perf_counter())

        setattr(owner, name, wrapped)

    def _wrap_call(self, executor) -> None:
        function, marks, events = executor._call, self.at, self.events

        def call(program, plan):
            marks.setdefault("call<", time.perf_counter())
            if events is not None and "device" not in marks:
                events[0].record()
            try:
                return function(program, plan)
            finally:
                if events is not None and "device" not in marks:
                    events[1].record()
                    marks["device"] = 0.0  # read after the request
                marks.setdefault("call>", time.perf_counter())

        executor._call = call

    def request(self, engine, tokens: list[int]) -> dict:
        """One request's phases in ms."""
        self.at.clear()
        self.gc.runs.clear()
        start = time.perf_counter()
        wall, reused, token = first_token(engine, tokens)
        at = self.at
        ms = {
            "admit": at["admit>"] - start, "schedule": at["schedule>"] - at["schedule<"],
            "prepack": at["pack<"] - at["schedule>"], "pack": at["pack>"] - at["pack<"],
            "call": at["call<"] - at["pack>"], "launch": at["call>"] - at["call<"], "host": at["call<"] - start,
            "ttft": wall,
        }
        ms = {key: value * 1e3 for key, value in ms.items()}
        if self.events is not None:
            self.events[1].synchronize()
            ms["device"] = self.events[0].elapsed_time(self.events[1])
        ms["reused"], ms["token"] = reused, token
        before = [run for run in self.gc.runs if run[1] < at["call<"]]
        ms["gc_before"] = sum(run[2] for run in before)
        ms["gc_runs"] = [run[0] for run in self.gc.runs]
        return ms


def first_token(engine, prompt: list[int]) -> tuple[float, int, int]:
    """Seconds to the first token of one greedy request, the prompt tokens it reused, the token."""
    seen: dict[str, float] = {}
    reused, tokens = [], []

    def record(event) -> None:
        if isinstance(event, TokenEvent):
            seen.setdefault("first", time.perf_counter())
            tokens.extend(event.token_ids)
        else:
            reused.append(event.num_reused_tokens)

    start = time.perf_counter()
    submit_greedy(engine, f"ttft-{time.perf_counter_ns()}", prompt, 1, record)
    engine.run_until_idle()
    return seen["first"] - start, reused[0], tokens[0]


def cache_checksum(model) -> list[int]:
    """Sums of the cache storage's 16-bit words, per cache buffer (in chunks: nothing large is
    allocated): equal after the same requests when every prefill wrote the same values."""
    sums = []
    for buffer in model.prepared.manifest.buffers:
        if buffer.role != mpb.BUFFER_ROLE_CACHE_STORAGE or buffer.name not in model.buffers:
            continue
        flat = model.buffers[buffer.name].reshape(-1).view(torch.int16)
        sums.append(sum(int(chunk.sum(dtype=torch.int64)) for chunk in flat.split(1 << 26)))
    return sums


class GcWatch:
    """The cyclic collector's runs while a request is timed: how many, by generation, and their ms."""

    def __init__(self) -> None:
        self.runs: list[tuple[int, float, float]] = []  # (generation, started, ms)
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.runs.append((info["generation"], self._started, (time.perf_counter() - self._started) * 1e3))

    def close(self) -> None:
        gc.callbacks.remove(self._callback)


class Baton:
    """Turn-taking of two processes through one file: it holds the name of the role whose turn it is."""

    def __init__(self, path: Path | None, role: str):
        self.path, self.role = path, role

    def wait(self, limit_s: float = 20.0) -> bool:
        if self.path is None:
            return True
        started = time.perf_counter()
        while time.perf_counter() - started < limit_s:
            try:
                if self.path.read_text().strip() == self.role:
                    return True
            except FileNotFoundError:
                pass
            time.sleep(0.002)
        return False

    def ready(self, limit_s: float = 45.0) -> bool:
        """Says this process is warm and waits until the other one says so too."""
        if self.path is None:
            return True
        self.path.with_suffix(f".ready-{self.role}").write_text("")
        other = self.path.with_suffix(f".ready-{'b' if self.role == 'a' else 'a'}")
        started = time.perf_counter()
        while not other.exists() and time.perf_counter() - started < limit_s:
            time.sleep(0.05)
        return other.exists()

    def pass_on(self) -> None:
        if self.path is not None:
            other = "b" if self.role == "a" else "a"
            scratch = self.path.with_suffix(f".{self.role}")
            scratch.write_text(other)
            scratch.replace(self.path)


def summarize(label: str, rows: list[dict]) -> dict:
    medians = {key: statistics.median(row[key] for row in rows) for key in PHASES if key in rows[0]}
    log(f"{label}: cold TTFT {medians['ttft']:.2f} ms median of {len(rows)} "
        f"(min {min(r['ttft'] for r in rows):.2f}, max {max(r['ttft'] for r in rows):.2f})")
    log(f"{label}: host before the program call {medians['host']:.3f} ms = admit {medians['admit']:.3f} + schedule "
        f"{medians['schedule']:.3f} + prepack {medians['prepack']:.3f} + pack {medians['pack']:.3f} + call "
        f"{medians['call']:.3f}; the call {medians['launch']:.3f} ms"
        + (f"; device {medians['device']:.2f} ms" if "device" in medians else ""))
    runs = [generation for row in rows for generation in row["gc_runs"]]
    log(f"{label}: the cyclic collector ran {len(runs)} times in the {len(rows)} requests (generations "
        f"{sorted(runs)}), {sum(r['gc_before'] for r in rows):.2f} ms of it before program calls")
    return {"medians_ms": medians, "rows": rows}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=None, help="prompt tokens (default 2048; smoke 64)")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--vocab", type=int, default=None, help="vocabulary of the prepared model")
    parser.add_argument("--staged", action="store_true",
                        help="on the CPU: stage every per-step buffer as on a device (the device path's host work)")
    parser.add_argument("--pages", type=int, default=4096)
    parser.add_argument("--label", default="this tree")
    parser.add_argument("--baton", type=Path, default=None, help="take turns with another process through this file")
    parser.add_argument("--role", choices=("a", "b"), default="a", help="a starts")
    parser.add_argument("--wait", type=Path, default=None, help="measure only once this file exists")
    parser.add_argument("--wait-s", type=float, default=120.0)
    parser.add_argument("--freeze", action="store_true",
                        help="collect and freeze the heap after loading, as the serving processes do (helios.server.heap)")
    parser.add_argument("--share-core", type=Path, default=None,
                        help="prepare the core into this folder (model.core, publisher.key.pub, then 'ready'), for --use-core")
    parser.add_argument("--use-core", type=Path, default=None,
                        help="load the core another process prepares into this folder (waits for its 'ready')")
    parser.add_argument("--fresh-ab", type=int, default=0,
                        help="after the turns, this many request pairs alternating the fresh-chunk graphs on and off "
                             "(helios.runtime.loading.fresh_calls; trees that have them)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    shape = SMOKE if args.smoke else with_layers(LLAMA_31_8B, args.layers)
    if args.vocab:
        shape = dataclasses.replace(shape, vocab_size=args.vocab)
    length = args.prompt or (64 if args.smoke else 2048)
    with tempfile.TemporaryDirectory() as scratch:
        if args.use_core is not None:
            opened = shared_core(args.use_core, args.wait_s + 120)
        elif args.share_core is not None:
            opened = kept_core(args.share_core, shape, length, device)
        else:
            opened = prepared_core(Path(scratch), shape, length, (), device)
        runtime = build_runtime(opened, RuntimeOptions(load=LoadOptions(
            StartupOptions(token_logprobs=False), device=str(device), cuda_graphs=device.type == "cuda",
            num_pages=args.pages)))
        try:
            engine = runtime.engine
            if args.staged:
                stage_everything(engine.executor.packer, runtime.model)
            if args.freeze:
                gc.collect()
                gc.freeze()
            marks = Marks(engine, device.type == "cuda")
            for salt in range(2):  # warm-up
                marks.request(engine, prompt(length, shape.vocab_size, 1 + salt))
            if args.wait is not None:
                started = time.perf_counter()
                while not args.wait.exists() and time.perf_counter() - started < args.wait_s:
                    time.sleep(0.2)
            baton = Baton(args.baton, args.role)
            if not baton.ready():
                log(f"{args.label}: the other process never got ready; measuring alone")
                baton = Baton(None, args.role)
            if baton.path is not None and args.role == "a":
                args.baton.write_text("a")
            rows = []
            for repeat in range(args.repeats):
                if not baton.wait():
                    log(f"{args.label}: the other process did not pass the turn on; measuring alone")
                    baton = Baton(None, args.role)
                rows.append(marks.request(engine, prompt(length, shape.vocab_size, 100 + repeat)))
                baton.pass_on()
            result = summarize(args.label, rows)
            result["tokens"] = [row["token"] for row in rows]
            result["cache_checksum"] = cache_checksum(runtime.model)
            log(f"{args.label}: first tokens {result['tokens']}; cache checksum {result['cache_checksum']}")
            if args.fresh_ab:
                result["fresh_ab"] = fresh_ab(engine, marks, args.fresh_ab, length, shape.vocab_size, args.label)
        finally:
            runtime.close()
    if args.json:
        args.json.write_text(json.dumps({"label": args.label, "layers": shape.num_hidden_layers, **result}, indent=1))
    return 0


def fresh_ab(engine, marks: Marks, pairs: int, length: int, vocab: int, label: str) -> dict:
    """Cold requests alternating the program's fresh-chunk graphs on and off (the executor's
    `is_fresh_chunk` answered False), same process, core and pool: medians of each."""
    from helios.runtime.execution import executor as executor_module

    decide = getattr(executor_module, "is_fresh_chunk", None)
    if decide is None:
        log(f"{label}: this tree has no fresh-chunk graphs; no fresh A/B")
        return {}
    rows = {"fresh": [], "paged": []}
    try:
        for index in range(2 * pairs):
            form = ("fresh", "paged")[index % 2]
            executor_module.is_fresh_chunk = decide if form == "fresh" else (lambda plan: False)
            rows[form].append(marks.request(engine, prompt(length, vocab, 1000 + index)))
    finally:
        executor_module.is_fresh_chunk = decide
    keys = [key for key in ("ttft", "device", "host") if key in rows["fresh"][0]]
    medians = {form: {key: statistics.median(r[key] for r in runs) for key in keys} for form, runs in rows.items()}
    for key in medians["fresh"]:
        fresh, paged = medians["fresh"][key], medians["paged"][key]
        log(f"{label}: fresh A/B {key}: fresh graphs {fresh:.3f} ms, paged {paged:.3f} ms, saved {paged - fresh:+.3f} "
            f"ms (medians of {pairs} each, alternating)")
    log(f"{label}: fresh A/B first tokens fresh {[r['token'] for r in rows['fresh']]} paged "
        f"{[r['token'] for r in rows['paged']]}")
    return {"medians_ms": medians, "tokens": {form: [r["token"] for r in runs] for form, runs in rows.items()}}


def kept_core(folder: Path, shape, length: int, device: torch.device):
    """Prepares the core (prefill capacity `length`) into `folder` for another process too: the
    checkpoint is removed once prepared (two 8B-shaped copies would not fit the device's disk)."""
    import shutil

    folder.mkdir(parents=True, exist_ok=True)
    key = SigningKey.generate()
    checkpoint = write_random_llama(folder / "checkpoint", shape, torch.bfloat16, device=device.type)
    plan = CapacityPlan(page_tokens=16, context_tokens=length + 64, prefill_tokens=length, decode_batches=(1,),
                        prefill_batches=(1,), mixed=False, page_capacity=8 * -(-(length + 64) // 16),
                        prefill_chunks=(), token_logprobs=False)
    started = time.perf_counter()
    prepare_core(checkpoint, folder / "model.core", key, PrepareOptions(NAMESPACE, capacities=plan))
    log(f"prepared in {time.perf_counter() - started:.0f} s")
    shutil.rmtree(checkpoint, ignore_errors=True)
    write_key_pair(folder / "publisher.key", key, [NAMESPACE])
    (folder / "ready").write_text("")
    return open_core(folder / "model.core", accept=NAMESPACE, trusted_keys=[key.public])


def shared_core(folder: Path, limit_s: float):
    """The core another process prepares into `folder` (`kept_core`), once it is ready."""
    started = time.perf_counter()
    while not (folder / "ready").exists():
        if time.perf_counter() - started > limit_s:
            raise TimeoutError(f"no core in {folder} after {limit_s:.0f} s")
        time.sleep(0.2)
    return reused_core(folder)


def stage_everything(packer, model) -> None:
    """The packer's staging rebuilt to stage host buffers too (the device path's logic on the CPU)."""
    from helios.runtime.execution.pack_staging import Staging
    packer._staging = Staging(model.prepared, model.buffers, True)


if __name__ == "__main__":
    sys.exit(main())
