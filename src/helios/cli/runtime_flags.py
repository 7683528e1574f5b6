"""Startup flags `serve` and `generate` share: cache pages, snapshots, speculation, preemption.

    add_runtime_flags(parser)                       # in register()
    load, policy, host_pages = runtime_flags(args, startup_fields)

`--pages N` fixes the physical cache pages (default: the core's page capacity on the CPU, or what
fits in `--memory-fraction` of the memory available where that is fewer; on CUDA,
`--memory-fraction` of the device memory free after loading). `--snapshot-capacity` sizes the
continuation rows snapshots use, `--speculative-width` selects a prepared width (1 turns
speculation off), `--history-drafting` / `--no-history-drafting` override the core's default, and
`--preemption offload --host-pages N` moves a preempted request's pages and state to N host slots
instead of recomputing them. `--image-cache-images N` sizes the device cache of encoded image
features of a vision-language core (allocated at load). `--compile-programs` compiles the CPU programs
with Inductor at load (`helios.runtime.loading.program_compile`), each compilation shown on stderr;
otherwise `--cpu-kernels auto|on|off` says whether the CPU programs' projections and ABI bodies run
through C++ kernels built at load (`helios.runtime.loading.cpu_kernels`; auto: where a C++ compiler
builds them).
`--compile-workers N` sets the worker processes that compile a CUDA load's Triton kernels before its
graphs are captured (`helios.runtime.loading.kernel_precompile`; 0: the warm-up runs compile them).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import TYPE_CHECKING

from helios.contract import StartupOptions
from helios.errors import UsageError
from helios.runtime.loading.defaults import DEFAULT_CACHE_BYTES, DEFAULT_CACHED_IMAGES, DEFAULT_MEMORY_FRACTION
from helios.runtime.scheduling.policy import PreemptionMode, SchedulerPolicy

if TYPE_CHECKING:
    from helios.runtime.loading.model import LoadOptions

MAX_COUNT = 2**31 - 1  # past any page, slot or worker count a machine holds; larger fails in torch, not here
_PREEMPTION = {"recompute": PreemptionMode.RECOMPUTE, "offload": PreemptionMode.OFFLOAD}
_CPU_KERNELS = {"auto": None, "on": True, "off": False}


def add_runtime_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("cache and scheduling")
    group.add_argument("--pages", type=int, metavar="N",
                       help="physical cache pages (default: the core's on the CPU, fewer where they do not fit the "
                       "available memory; sized from free memory on CUDA)")
    group.add_argument("--memory-fraction", type=float, default=DEFAULT_MEMORY_FRACTION, metavar="F",
                       help="without --pages: share of the memory free after loading that pages may take (CUDA: "
                       f"sized to it, and loaded again at up to 0.2 less where the CUDA graph capture then runs out of memory; "
                       f"CPU: the core's pages, fewer where they exceed it) (default {DEFAULT_MEMORY_FRACTION})")
    group.add_argument("--snapshot-capacity", type=int, metavar="N",
                       help="continuation rows for snapshots at exact endpoints (default: the core's)")
    group.add_argument("--speculative-width", type=int, metavar="W",
                       help="speculative width among the core's prepared widths; 1 disables speculation "
                       "(default: the core's)")
    drafting = group.add_mutually_exclusive_group()
    drafting.add_argument("--history-drafting", dest="history_drafting", action="store_true", default=None,
                          help="draft proposals from each request's own history")
    drafting.add_argument("--no-history-drafting", dest="history_drafting", action="store_false",
                          help="do not draft from request history (default for both: the core's setting)")
    group.add_argument("--preemption", choices=sorted(_PREEMPTION), default="recompute",
                       help="what a preempted request keeps: recompute (default) or offload to host slots")
    group.add_argument("--host-pages", type=int, default=0, metavar="N",
                       help="host-memory slots for offloaded pages and state (needed by --preemption offload; "
                       "default 0: none)")
    group.add_argument("--image-cache-images", type=int, metavar="N",
                       help="vision-language cores: images whose encoded features stay on the device for reuse by "
                       f"content hash, allocated at load (default {DEFAULT_CACHED_IMAGES}, fewer when their slots of "
                       f"the largest image would pass {DEFAULT_CACHE_BYTES >> 30} GiB)")
    group.add_argument("--compile-programs", action="store_true",
                       help="on the CPU: compile each program's runs of small tensor ops with torch Inductor at load "
                       "(fused C++ kernels; needs a C++ compiler; load takes about 5-25 s more per program, "
                       "serving compiles nothing); decode steps run faster, results equal within float rounding")
    group.add_argument("--cpu-kernels", choices=("auto", "on", "off"), default="auto",
                       help="on the CPU without --compile-programs: run the programs' projections (over a copy "
                       "of their weights packed at load), attention, cache writes, sampling, norms, SiLU-mul and "
                       "rotary through C++ kernels built at load (about 2 s each the first time on a machine, then "
                       "cached); auto (default): where a C++ compiler builds them, on: fail the load otherwise, "
                       "off: torch's linear and the Python bodies")
    group.add_argument("--compile-workers", type=int, metavar="N",
                       help="on CUDA: worker processes compiling the Triton kernels the captured graphs need, side "
                       "by side, before capture (default: the CPUs less one, at most 14; 0: the warm-up runs "
                       "compile them one after another; at most the CPUs)")
    group.add_argument("--no-logprobs", dest="token_logprobs", action="store_false", default=None,
                       help="do not load the core's token-logprobs programs (a faster start; requests for "
                       "log-probabilities are refused)")


# The contract paths of the startup options (`helios.contract.resolve_settings`) and the flags of
# `serve` and `generate` that set them.
_STARTUP_FLAGS = {
    "startup.context_tokens": "--context-tokens", "startup.max_concurrency": "--max-active",
    "startup.snapshot_capacity": "--snapshot-capacity", "startup.speculative_width": "--speculative-width",
    "startup.history_drafting": "--history-drafting",
}


def check_startup_flags(prepared, startup: StartupOptions) -> None:
    """The startup options against the core's contract (`prepared`), once it is open and before the
    load: a value the core cannot honour is refused naming the flag given, where the contract's
    check names its own path (``startup.context_tokens: 100000 is outside the prepared range``),
    which no flag spells."""
    from helios.contract import StartupOptionError, resolve_settings

    try:
        resolve_settings(prepared, startup)
    except StartupOptionError as error:
        if error.path not in _STARTUP_FLAGS:
            raise
        raise StartupOptionError(_STARTUP_FLAGS[error.path], error.reason) from None


def _stderr(line: str) -> None:
    if sys.stderr is None:  # started with standard error closed (`2>&-`): print would write the line to stdout
        return
    print(f"helios: {line}", file=sys.stderr, flush=True)


def _check_device_name(device: str) -> None:
    import torch  # here, not above: `helios serve` registers these flags before it imports torch

    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError, ValueError):
        raise UsageError(f"--device {device!r} is not a device: give cpu, cuda or cuda:N") from None
    if kind not in ("cpu", "cuda"):
        raise UsageError(f"--device {device!r}: models run on the CPU or on CUDA (cpu, cuda or cuda:N)")


def runtime_flags(args: argparse.Namespace, startup: StartupOptions, device: str
                  ) -> tuple[LoadOptions, SchedulerPolicy, int]:
    """(load options, scheduler policy, host pages) from the flags; bad values raise `UsageError`,
    `device` among them when it names no CPU or CUDA device (one this machine lacks is the load's error)."""
    _check_device_name(device)
    for name in ("pages", "snapshot_capacity", "speculative_width"):
        value = getattr(args, name)
        if value is not None and value <= 0 and not (name == "snapshot_capacity" and value == 0):
            raise UsageError(f"--{name.replace('_', '-')} must be positive")
    if not 0 < args.memory_fraction <= 1:
        raise UsageError("--memory-fraction must be in (0, 1]")
    if args.image_cache_images is not None and args.image_cache_images < 1:
        raise UsageError("--image-cache-images must be positive")
    if args.host_pages < 0:
        raise UsageError("--host-pages must not be negative")
    if args.compile_workers is not None and args.compile_workers < 0:
        raise UsageError("--compile-workers must not be negative")
    for name in ("pages", "snapshot_capacity", "speculative_width", "image_cache_images", "host_pages",
                 "compile_workers"):
        value = getattr(args, name)
        if value is not None and value > MAX_COUNT:
            raise UsageError(f"--{name.replace('_', '-')} must be at most {MAX_COUNT}")
    if args.preemption == "offload" and args.host_pages == 0:
        raise UsageError("--preemption offload needs --host-pages N (host slots to offload into)")
    from helios.runtime.loading.model import LoadOptions  # torch: at run time only

    startup = replace(startup, snapshot_capacity=args.snapshot_capacity, speculative_width=args.speculative_width,
                      history_drafting=args.history_drafting, token_logprobs=args.token_logprobs)
    load = LoadOptions(startup, device=device, num_pages=args.pages, memory_fraction=args.memory_fraction,
                       image_cache_images=args.image_cache_images, compile_programs=args.compile_programs,
                       compile_workers=args.compile_workers, cpu_kernels=_CPU_KERNELS[args.cpu_kernels],
                       progress=_stderr if args.compile_programs or args.cpu_kernels != "off" else None)
    return load, SchedulerPolicy(preemption=_PREEMPTION[args.preemption]), args.host_pages
