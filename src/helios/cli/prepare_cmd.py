"""`helios prepare CHECKPOINT -o MODEL.core --key KEY --namespace NS`: checkpoint -> signed core."""

from __future__ import annotations

import argparse
import os
import sys
import time
import unicodedata
from pathlib import Path

from helios.cli.core_cmd import one_line, through_link
from helios.cli.core_options import check_output_path, check_room_beside, load_private_key, naming_output
from helios.cli.termination import terminate_as_exception
from helios.core.keys import check_namespace
from helios.errors import UsageError
from helios.ignition.export import (
    MAX_CONTEXT_TOKENS, MAX_PAGE_TOKENS, MAX_PAGES, CapacityPlan, PrepareOptions, prepare_core,
)
from helios.ignition.program_spec import MAX_BATCH_CAPACITY, MAX_VERIFY_TOKENS
from helios.ignition.speculative_plan import SpeculativePlan


# --prefill-tokens when not given: a smaller --context-tokens lowers it to the context (a prefill
# step never holds more than one request's context), rather than failing on a value never set.
DEFAULT_PREFILL_TOKENS = 256
# --page-tokens when not given: a smaller --context-tokens lowers it to the largest power of two
# within the context (`--context-tokens 8` failed on the default, "page_tokens 16 exceeds
# context_tokens"); a power of two, as the default is, still divides a compressed cache's records.
DEFAULT_PAGE_TOKENS = 16


def _batches(text: str) -> tuple[int, ...]:
    """A comma-separated list of positive integers (batch capacities, token capacities, widths:
    argparse names the option before the message)."""
    try:
        values = tuple(int(part) for part in text.split(",") if part)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _stated(text: str) -> tuple[str, str]:
    key, found, value = text.partition("=")
    if not found or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.replace("\\n", "\n").replace("\\t", "\t")  # newlines are written \\n


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "prepare", help="prepare a Hugging Face checkpoint into a signed core",
        description="Capture the checkpoint's programs at the given capacities, declare the serving "
        "contract and write one signed core (weights, programs, tokenizer, chat template).",
    )
    parser.add_argument("checkpoint", metavar="CHECKPOINT", help="checkpoint directory (config.json, *.safetensors, tokenizer files)")
    parser.add_argument("-o", "--output", required=True, metavar="OUT", help="core file to write")
    parser.add_argument("--key", required=True, metavar="KEY", help="Ed25519 private key (from `helios keygen`)")
    parser.add_argument("--namespace", required=True, metavar="NS", help="publisher namespace signed into the core")
    parser.add_argument("--served-id", metavar="NAME", help="model name served by the API (default: the namespace)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), help="weight dtype (default: the checkpoint's)")
    parser.add_argument("--license", default="", metavar="TEXT",
                        help="license terms recorded in the signed payload (default: none)")
    parser.add_argument("--page-tokens", type=int, metavar="N",
                        help=f"tokens per cache page (default {DEFAULT_PAGE_TOKENS}, or the largest power of two "
                        "within the context if --context-tokens is smaller)")
    parser.add_argument("--context-tokens", type=int, default=2048, metavar="N", help="largest prompt+output per request (default 2048)")
    parser.add_argument("--prefill-tokens", type=int, metavar="N",
                        help=f"prompt tokens per prefill step (default {DEFAULT_PREFILL_TOKENS}, or the "
                        "context if --context-tokens is smaller)")
    parser.add_argument("--prefill-chunks", type=_batches, default=(), metavar="N,N",
                        help="smaller prompt-token capacities also captured for prefill and mixed steps, e.g. 64,512 "
                        "(a short prompt then runs a smaller program; default none)")
    parser.add_argument("--decode-batches", type=_batches, default=(1, 4, 16), metavar="N,N",
                        help="captured decode batch capacities, comma-separated (default 1,4,16)")
    parser.add_argument("--patch-capacities", type=_batches, default=(), metavar="N,N",
                        help="vision-language checkpoints: image patch capacities of the captured vision "
                        "programs (default: the largest image the checkpoint's processor produces)")
    parser.add_argument("--no-mixed", action="store_true", help="do not capture the mixed prefill+decode program")
    parser.add_argument("--scored-prefill", action="store_true", help="also capture a scored-prefill program")
    parser.add_argument("--no-logprobs", action="store_true",
                        help="do not capture the token-logprobs variants (the core then refuses logprobs requests)")
    speculative = parser.add_argument_group("speculative generation (with --draft)")
    speculative.add_argument("--draft", metavar="DIR",
                             help="draft checkpoint (same vocabulary) prepared into the core for speculative generation")
    speculative.add_argument("--speculative-widths", type=_batches, metavar="W,...",
                             help="verify widths W of the SPECULATIVE programs, pending token included (default 1,4)")
    speculative.add_argument("--speculative-batches", type=_batches, metavar="B,...",
                             help="SPECULATIVE batch capacities (default: the decode batches)")
    speculative.add_argument("--draft-tokens", type=int, metavar="D",
                             help="proposal draws per round of every wider program (default W - 1)")
    speculative.add_argument("--allocate-prefixes", action="store_true",
                             help="lanes get ceilings and the program allocates prefixes from proposal confidence")
    speculative.add_argument("--packed-per-lane", type=int, metavar="N",
                             help="packed target positions P = B x N (default W: rectangular)")
    parser.add_argument("--frontend", action="append", type=_stated, default=[], metavar="KEY=VALUE",
                        help="state a frontend fact instead of deriving it from the chat template: "
                        "family=NAME|none (tool syntax), reasoning=none, message_start=TEXT, "
                        "assistant_header=TEXT, message_end=TEXT (repeatable)")
    parser.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                        help="prepare for N tensor-parallel ranks: one program set, N weight shards (default 1)")
    parser.set_defaults(func=run)


def _speculative_plan(args: argparse.Namespace) -> SpeculativePlan | None:
    """The plan of --draft and its options; an option given without --draft (a zero too) is refused,
    not dropped: the core would be prepared without speculation and nothing would say so."""
    if args.draft is None:
        given = [args.speculative_widths, args.speculative_batches, args.draft_tokens, args.packed_per_lane]
        if args.allocate_prefixes or any(value is not None for value in given):
            raise UsageError("speculative options need --draft")
        return None
    draft = Path(args.draft)
    if not draft.is_dir():
        raise UsageError(f"{draft} is not a checkpoint directory")
    _check_most("--speculative-widths", args.speculative_widths, MAX_VERIFY_TOKENS)
    _check_most("--speculative-batches", args.speculative_batches, MAX_BATCH_CAPACITY)
    if args.draft_tokens is not None and not 1 <= args.draft_tokens <= MAX_VERIFY_TOKENS:
        raise UsageError(f"--draft-tokens must be in 1..{MAX_VERIFY_TOKENS}")
    if args.packed_per_lane is not None and args.packed_per_lane < 1:
        raise UsageError("--packed-per-lane must be positive")
    widths = args.speculative_widths or SpeculativePlan.widths  # the dataclass's default, (1, 4)
    return SpeculativePlan(draft, widths=widths, batches=args.speculative_batches,
                           draft_tokens=args.draft_tokens, allocate_prefixes=args.allocate_prefixes,
                           packed_per_lane=args.packed_per_lane)


def _token_extents(args: argparse.Namespace) -> tuple[int, int]:
    """(page tokens, prefill tokens): the options given, else their defaults fitted to the context;
    each capacity option checked against its bounds here, before the checkpoint is read, so that a
    mistake is refused naming the option given (`CapacityPlan` names its own fields, which no
    option spells: "prefill_tokens", "page_tokens")."""
    context = args.context_tokens
    if not 1 <= context <= MAX_CONTEXT_TOKENS:
        raise UsageError(f"--context-tokens must be in 1..{MAX_CONTEXT_TOKENS}")
    page = args.page_tokens
    if page is None:
        page = min(DEFAULT_PAGE_TOKENS, 1 << (context.bit_length() - 1))
    elif not 1 <= page <= MAX_PAGE_TOKENS:
        raise UsageError(f"--page-tokens must be in 1..{MAX_PAGE_TOKENS}")
    elif page > context:
        raise UsageError(f"--page-tokens {page} exceeds --context-tokens {context}: a page holds at most one "
                         f"request's context")
    prefill = args.prefill_tokens
    if prefill is None:
        prefill = min(DEFAULT_PREFILL_TOKENS, context)
    elif not 1 <= prefill <= context:
        raise UsageError(f"--prefill-tokens must be in 1..{context} (--context-tokens): a prefill step holds at "
                         f"most one request's context")
    if any(chunk >= prefill for chunk in args.prefill_chunks):
        raise UsageError(f"--prefill-chunks must each be smaller than the prefill tokens ({prefill}, "
                         f"--prefill-tokens), got {','.join(map(str, args.prefill_chunks))}")
    _check_most("--decode-batches", args.decode_batches, MAX_BATCH_CAPACITY)
    if -(-context // page) * max(args.decode_batches) > MAX_PAGES:
        raise UsageError(f"--context-tokens {context} in pages of {page} tokens (--page-tokens) for "
                         f"{max(args.decode_batches)} requests (--decode-batches) exceed {MAX_PAGES} cache pages")
    return page, prefill


def _check_most(option: str, values: tuple[int, ...] | None, largest: int) -> None:
    """A list option's values (positive: `_batches`) against their largest, naming the option."""
    if values and max(values) > largest:
        raise UsageError(f"{option} must each be at most {largest}, got {max(values)}")


def _check_frontend_facts(args: argparse.Namespace) -> None:
    """A --frontend key stated twice with two values is refused: the last one won, the other
    dropped without a word (the same value twice is the same statement)."""
    stated: dict[str, str] = {}
    for key, value in args.frontend:
        if stated.setdefault(key, value) != value:
            raise UsageError(f"--frontend states {key} twice, as {stated[key]!r} and {value!r}; state it once")


def _check_signed_text(args: argparse.Namespace) -> None:
    """The namespace, served id and license are signed into the core and shown by `helios inspect`
    and the API: checked before capture, and never with control characters (a terminal would act on
    an escape sequence); the license may span lines."""
    try:
        check_namespace(args.namespace)
    except ValueError as error:
        raise UsageError(f"--namespace: {error}") from None
    if args.served_id is not None and (not args.served_id or _has_control(args.served_id)):
        raise UsageError(f"--served-id {args.served_id!r} is empty or holds control characters")
    if _has_control(args.license.replace("\n", "").replace("\t", "")):
        raise UsageError("--license holds control characters other than newlines and tabs")


def _is_input_file(output: Path, checkpoint: Path) -> bool:
    """Whether `output` names a file preparation reads from `checkpoint` (weights, configs, tokenizer,
    template): the finished core would replace it. Also where a file of the checkpoint is a link to
    it (``model.safetensors -> store/model.safetensors``, a link inside the checkpoint prepare
    follows): the same file, whatever its name."""
    if not output.is_file():
        return False
    if output.suffix in (".safetensors", ".json", ".jinja") and output.resolve().parent == checkpoint.resolve():
        return True
    try:
        return any(entry.is_file() and os.path.samefile(entry, output) for entry in checkpoint.iterdir())
    except OSError:
        return False


def _has_control(text: str) -> bool:
    return any(unicodedata.category(ch) == "Cc" for ch in text)


def run(args: argparse.Namespace) -> int:
    checkpoint, output = Path(args.checkpoint), Path(args.output)
    _check_signed_text(args)
    _check_frontend_facts(args)
    if not checkpoint.is_dir():
        raise UsageError(f"{checkpoint} is not a checkpoint directory")
    # Refused before minutes of capture: the core is written as a temporary file beside `output`.
    if output.is_dir():
        raise UsageError(f"-o {output} is a directory; name the core file to write")
    if not output.parent.is_dir():
        raise UsageError(f"-o {output}: the directory {output.parent} does not exist")
    check_output_path("-o", output, {"--key file": args.key, "public key of --key": f"{args.key}.pub"})
    output = through_link(output)  # as sign, relocate and contract encode write: the link itself was replaced
    for source in (checkpoint, Path(args.draft) if args.draft else None):  # the file written, a link's target
        if source is not None and _is_input_file(output, source):
            raise UsageError(f"-o {args.output} would replace a file of the checkpoint {source}")
    check_room_beside("-o", output)
    key = load_private_key(args.key)
    page_tokens, prefill_tokens = _token_extents(args)
    plan = CapacityPlan(
        page_tokens=page_tokens, context_tokens=args.context_tokens, prefill_tokens=prefill_tokens,
        decode_batches=args.decode_batches, mixed=not args.no_mixed, scored_prefill=args.scored_prefill,
        token_logprobs=not args.no_logprobs,
        speculative=_speculative_plan(args), prefill_chunks=args.prefill_chunks,
        patch_capacities=args.patch_capacities,
    )
    if args.tensor_parallel < 1:
        raise UsageError("--tensor-parallel must be at least 1")
    options = PrepareOptions(args.namespace, served_id=args.served_id, dtype=args.dtype, license=args.license,
                             capacities=plan, tensor_parallel=args.tensor_parallel, frontend=tuple(args.frontend))
    started = time.monotonic()
    # Paths go through `one_line` (the progress lines name the output too): a newline in a file name
    # would start a line of its own, which could pass for one prepare writes.
    with terminate_as_exception(), naming_output(output):  # SIGTERM: the temporary core removed, exit 143
        written = prepare_core(checkpoint, output, key, options,
                               progress=lambda line: print(f"  {one_line(line)}", file=sys.stderr, flush=True))
    total = sum(info.stored_nbytes for info in written.resources)
    print(f"wrote {', '.join(one_line(str(f)) for f in written.files)}: {len(written.resources)} resources, "
          f"{total / 1e6:.1f} MB stored, in {time.monotonic() - started:.1f} s")
    return 0
