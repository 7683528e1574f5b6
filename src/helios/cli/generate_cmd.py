"""`helios generate [MODEL.core --accept NS] (PROMPT ... | --prompt-ids JSON)`: offline batch generation.

Without a core file the embedded default model is used (prepared into the cache on first use, as
`helios serve` does), and text prompts are rendered as chat user messages, since it is a chat model:
``helios generate "What is 2 + 3?"`` needs nothing else. The first positional is the core when it
is an existing file or ends in ``.core``; otherwise every positional is a prompt. Output into a
pipe whose reader stopped (``| head``) ends quietly with status 141, as SIGPIPE would end it; a
closed standard output (``>&-``) is refused before anything loads, and with standard error closed
(``2>&-``) its lines are dropped rather than printed among the output. The prompt ``-`` is the
whole of standard input (``cat question.txt | helios generate -``).

Ctrl-C (SIGINT) or SIGTERM while the batch generates still prints every prompt's output, those
that had not finished cut where they stopped (``finish_reason`` "cancelled" under --json), then
one line on standard error and status 130 or 143: the results only come at the end of the batch,
so an interrupted run printed nothing of minutes of generation.

Every mistake the command line can hold is refused before the model loads (exit 2): option values
before the core is opened, and prompts (tokenized with the core's tokenizer, read before the load)
whose ids leave the core's input vocabulary, that leave no room for output in its context extent,
or that, with an explicit --max-tokens, pass it (without one a prompt generates up to 64 tokens or
what its context leaves, as the server's omitted limit does).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from tokenizers import Tokenizer

from helios.cli.core_options import add_core_options, open_core_from_args, refuse_core_keys_without_core
from helios.cli.rank_options import add_rank_options, rank_options_from_args
from helios.cli.termination import Terminated, terminate_as_exception
from helios.core.reader import open_core
from helios.errors import LoadError, UsageError
from helios.frontend.decoding.detokenize import IncrementalDetokenizer
from helios.frontend.preparation.template import ChatTemplate
from helios.cli.runtime_flags import MAX_COUNT, add_runtime_flags, check_startup_flags, runtime_flags
from helios.contract import StartupOptions
from helios.frontend.decoding.text_bounds import is_unicode_text
from helios.runtime.loading.model import resource_of_kind
from helios.runtime import offline
from helios.runtime.offline import Generation, OfflineOutputs
from helios.runtime.records.events import FinishReason
from helios.runtime.records.sampling_params import SamplingParams, signed_seed
from helios.runtime.service import RuntimeOptions, build_runtime
from helios.server.heap import frozen_heap

DEFAULT_MAX_TOKENS = 64  # an output limit per prompt where --max-tokens is not given (capped by the context)
EXIT_BROKEN_PIPE = 141  # as a shell reports a command SIGPIPE ended (128 + 13)
EXIT_INTERRUPTED = 130  # as a shell reports a command SIGINT ended (128 + 2); SIGTERM's is Terminated.exit_code
STDIN_PROMPT = "-"  # the prompt that is the whole of standard input
MAX_STDIN_NBYTES = 64 * 1024 * 1024  # far past any context extent: /dev/zero is refused, not read for ever
EXIT_STATUS_HELP = (
    "exit status: 0 every prompt generated; 1 a file that cannot be read; 2 a usage mistake (options, "
    "prompts that do not fit the core), refused before the model loads; 3 to 8 the core cannot be opened, "
    "verified, admitted or loaded; 9 a prompt failed or was rejected (its line on stderr); 130 / 143 "
    "interrupted by SIGINT / SIGTERM (the outputs so far are printed first); 141 the reader of the output "
    "stopped (| head)."
)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "generate", help="generate from a core offline (all prompts in one batch)",
        description="Load a verified core and generate for every prompt through the same runtime the "
        "server uses. Prompts are text (tokenized with the core's tokenizer; --chat applies its chat "
        "template to each as a user message) or token ids (--prompt-ids). Every prompt's output is printed "
        "at the end of the batch, one per prompt in order.",
        epilog=EXIT_STATUS_HELP,
    )
    parser.add_argument("core", nargs="?", metavar="MODEL.core", help="core file (default: the embedded default model, chat prompts)")
    parser.add_argument("prompts", nargs="*", metavar="PROMPT",
                        help=f"prompt texts; {STDIN_PROMPT} is one prompt, the whole of standard input (UTF-8, "
                             "without its final line end)")
    parser.add_argument("--prompt-ids", metavar="JSON", help='JSON list of token-id lists, e.g. "[[1, 2, 3]]"')
    parser.add_argument("--chat", action="store_true", help="render each prompt as a user message with the chat template")
    parser.add_argument("--max-tokens", type=int, default=None, metavar="N",
                        help=f"tokens to generate per prompt (default {DEFAULT_MAX_TOKENS}, or what the context "
                             "extent leaves after the prompt where that is less)")
    parser.add_argument("--temperature", type=float, default=0.0, metavar="T",
                        help="sampling temperature in [0, 2]; 0 is greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0, metavar="P",
                        help="nucleus probability mass in (0, 1] (default 1)")
    parser.add_argument("--top-k", type=int, default=0, metavar="K", help="top-k cutoff; 0 disables (default)")
    parser.add_argument("--seed", type=int, default=0, metavar="N",
                        help="sampling seed, a signed 64-bit integer (default 0): a prompt's sampled tokens "
                             "depend on it and the prompt alone, not on the prompts beside it")
    parser.add_argument("--ignore-eos", action="store_true", help="do not stop at the core's EOS tokens")
    parser.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    parser.add_argument("--device", default="cpu", metavar="DEVICE", help="torch device of the model: cpu (default), cuda or cuda:N")
    add_runtime_flags(parser)
    add_core_options(parser, accept_required=False)
    add_rank_options(parser)
    parser.set_defaults(func=run)


def _prompt_ids(args, tokenizer: Tokenizer, template: str, template_tokens) -> list[list[int]]:
    if args.prompt_ids:
        return _parsed_prompt_ids(args.prompt_ids)
    for text in args.prompts:
        if not is_unicode_text(text):  # bytes that are not UTF-8 arrive as lone surrogates
            raise UsageError(f"prompt {text!r} is not valid UTF-8 text")
    if args.chat:
        chat = ChatTemplate(template, template_tokens)
        texts = [chat.render([{"role": "user", "content": text}], add_generation_prompt=True) for text in args.prompts]
        ids = [tokenizer.encode(text, add_special_tokens=False).ids for text in texts]
    else:
        ids = [tokenizer.encode(text).ids for text in args.prompts]
    for index, prompt in enumerate(ids):
        if not prompt:
            raise UsageError(f"prompt {index + 1} is empty: it has no tokens to generate from")
    return ids


def _parsed_prompt_ids(text: str) -> list[list[int]]:
    try:
        ids = json.loads(text)
    except ValueError as error:
        raise UsageError(f"--prompt-ids is not JSON: {error}") from None
    except RecursionError:  # nested past the interpreter's limit
        raise UsageError("--prompt-ids is nested too deeply") from None
    if not isinstance(ids, list) or not ids or not all(
            isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p) for p in ids):
        raise UsageError("--prompt-ids must be a JSON list of non-empty lists of integers")
    return ids


def _is_core_path(text: str) -> bool:
    if text == STDIN_PROMPT:  # the prompt read from standard input, even beside a file named "-"
        return False
    try:
        return text.endswith(".core") or Path(text).is_file()
    except OSError:  # a prompt no path can be (too long a name, say)
        return False


def _is_checkpoint_dir(text: str) -> bool:
    try:
        return (Path(text) / "config.json").is_file()
    except OSError:  # a prompt no path can be
        return False


def _split_core_and_prompts(args: argparse.Namespace) -> None:
    """The first positional is the core when it names one, else the first prompt; then exactly one of
    prompt texts and --prompt-ids must be given (checked before any load). The prompt `-` is replaced
    by standard input's text (`_stdin_prompt`)."""
    if args.core is not None and not _is_core_path(args.core):
        if _is_checkpoint_dir(args.core):  # else taken for a prompt, answered by the embedded model
            raise UsageError(f"{args.core} is a checkpoint directory; generate takes a prepared core: "
                             f"`helios prepare {args.core} -o MODEL.core ...` makes one")
        args.prompts = [args.core, *(args.prompts or [])]
        args.core = None
    if bool(args.prompts) == bool(args.prompt_ids):
        raise UsageError("give prompt texts or --prompt-ids, not both or neither")
    if args.chat and args.prompt_ids:  # ids are the prompt as given: no template renders them
        raise UsageError("--chat renders prompt texts with the chat template; --prompt-ids are used as given")
    if args.prompts.count(STDIN_PROMPT) > 1:  # standard input is read once: a second would be empty
        raise UsageError(f"the prompt {STDIN_PROMPT} (standard input) is given more than once")
    args.prompts = [_stdin_prompt() if text == STDIN_PROMPT else text for text in args.prompts]


def _stdin_prompt() -> str:
    """The prompt `-`: the whole of standard input as UTF-8 text, without one final line end (as
    ``echo TEXT |`` adds one: the same prompt as TEXT given as an argument). Refused (`UsageError`)
    when standard input is closed, empty (a mistake upstream: ``< /dev/null``, a command that
    printed nothing), larger than `MAX_STDIN_NBYTES` or not UTF-8."""
    if sys.stdin is None:  # started with standard input closed (`<&-`)
        raise UsageError(f"the prompt {STDIN_PROMPT} reads standard input, which is closed")
    try:
        data = sys.stdin.buffer.read(MAX_STDIN_NBYTES + 1)
    except OSError as error:
        raise UsageError(f"cannot read the prompt {STDIN_PROMPT} from standard input: "
                         f"{error.strerror or error}") from None
    if not data:
        raise UsageError(f"standard input is empty: the prompt {STDIN_PROMPT} is read from it")
    if len(data) > MAX_STDIN_NBYTES:
        raise UsageError(f"standard input holds more than {MAX_STDIN_NBYTES} bytes: no prompt is that long")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UsageError(f"the prompt {STDIN_PROMPT}: standard input is not UTF-8 text (byte {error.start} "
                         f"is {data[error.start]:#04x})") from None
    return text.removesuffix("\n").removesuffix("\r")


def _open(args: argparse.Namespace):
    """The core to generate from: the given file, else the embedded model (prompts as chat)."""
    if args.core is not None:
        if not args.accept:
            raise UsageError("--accept NAMESPACE is required to generate from a core file")
        return open_core_from_args(args, args.core)
    from helios.embedded.prepared import embedded_core

    embedded = embedded_core()
    args.chat = True
    return open_core(embedded.path, accept=args.accept or embedded.namespace, trusted_keys=[embedded.public_key])


def _check_sampling_options(args: argparse.Namespace) -> None:
    """The sampling options against their bounds (the server's, `helios.server.schemas`), before any
    core is opened; the output limit is checked against the core's context extent once it is open."""
    if args.max_tokens is not None and not 0 < args.max_tokens <= MAX_COUNT:
        raise UsageError(f"--max-tokens must be in 1..{MAX_COUNT}")
    if not 0 <= args.temperature <= 2:  # nan fails too
        raise UsageError("--temperature must be in [0, 2]")
    if not 0 < args.top_p <= 1:
        raise UsageError("--top-p must be in (0, 1]")
    if args.top_k < 0:
        raise UsageError("--top-k must not be negative")
    if not -(2**63) <= args.seed < 2**63:  # the server's bounds of `seed`
        raise UsageError("--seed must be a signed 64-bit integer, in [-2**63, 2**63)")


def run(args: argparse.Namespace) -> int:
    if sys.stdout is None:  # started with standard output closed (`>&-`): the output would be lost after the load
        raise UsageError("standard output is closed: nowhere to write the generated text")
    _check_sampling_options(args)
    load, policy, host_pages = runtime_flags(args, StartupOptions(), args.device)
    _split_core_and_prompts(args)
    if args.core is None:
        refuse_core_keys_without_core(args)
    if args.prompt_ids:
        _parsed_prompt_ids(args.prompt_ids)  # checked before the core is opened
    options = RuntimeOptions(load, policy=policy, host_pages=host_pages, ranks=rank_options_from_args(args))
    core = _open(args)
    check_startup_flags(core.prepared, load.startup)
    tokenizer, template = _tokenizer_and_template(core)
    template_tokens = {t.name: t.text for t in core.prepared.contract.defaults.template_tokens}
    args.prompt_token_ids = _prompt_ids(args, tokenizer, template, template_tokens)
    # before the load, which takes seconds to minutes
    args.output_limits = _output_limits(args.prompt_token_ids, args.max_tokens, core.prepared)
    runtime = build_runtime(core, options)
    try:
        with frozen_heap():  # the load's objects out of the collector's full walks while generating
            return _generate(args, runtime)
    finally:
        runtime.close()


def _tokenizer_and_template(core) -> tuple[Tokenizer, str]:
    """The core's tokenizer and chat template source, read before the load so that the prompts are
    checked first; `LoadError` for a core without them or whose tokenizer does not parse."""
    def resource(kind: str) -> str:
        try:
            return core.read_resource(resource_of_kind(core, kind)).decode("utf-8")
        except UnicodeDecodeError:
            raise LoadError(f"the core's {kind.lower()} resource is not UTF-8 text") from None

    text = resource("TOKENIZER")  # its read errors keep their own type (a sealed core without --aes-key: exit 4)
    try:
        tokenizer = Tokenizer.from_str(text)
    except Exception as error:  # noqa: BLE001 - the tokenizers library raises its own untyped errors
        raise LoadError(f"the core's tokenizer does not parse: {error}") from None
    return tokenizer, resource("CHAT_TEMPLATE")


def _output_limits(prompts: list[list[int]], max_tokens: int | None, prepared) -> list[int]:
    """Each prompt's output limit, once its ids are checked against the core's input vocabulary and
    the limit against its context extent: what the engine would otherwise reject (exit 9) once the
    model is loaded. Without --max-tokens a prompt gets `DEFAULT_MAX_TOKENS` or what its context
    leaves, as the server's omitted limit does; an explicit one must fit."""
    begin, end = prepared.input_range
    context_tokens = prepared.defaults.context_tokens
    limits = []
    for number, prompt in enumerate(prompts, 1):
        outside = next((t for t in prompt if not begin <= t < end), None)
        if outside is not None:
            raise UsageError(f"prompt {number}: token id {outside} is outside the core's vocabulary [{begin}, {end})")
        room = context_tokens - len(prompt)
        if room < 1:
            raise UsageError(f"prompt {number}: {len(prompt)} prompt tokens leave no room for output in the context "
                             f"extent of {context_tokens} tokens; shorten the prompt")
        if max_tokens is not None and max_tokens > room:
            raise UsageError(f"prompt {number}: {len(prompt)} prompt tokens + --max-tokens {max_tokens} exceed the "
                             f"context extent of {context_tokens} tokens; ask for at most {room} "
                             f"token{'s' if room > 1 else ''}")
        limits.append(min(max_tokens or DEFAULT_MAX_TOKENS, room))
    return limits


def _output_text(tokenizer: Tokenizer, token_ids, context_ids, clean_up_spaces: bool = False) -> str:
    """The output's text as it continues `context_ids` (a plain prompt: a SentencePiece word keeps
    its leading space, as the server's text completions have it; a chat prompt's answer starts the
    text), special tokens left out, with the core's tokenization-space cleanup where it has one."""
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=True, context_ids=context_ids,
                                         clean_up_spaces=clean_up_spaces)
    return detokenizer.feed_many(list(token_ids)) + detokenizer.finish()


def _generate(args: argparse.Namespace, runtime) -> int:
    """Generates for `args.prompt_token_ids` (the checked prompts `run` tokenized) and prints the
    results; interrupted (SIGINT, SIGTERM), it prints what the prompts have so far, then says so."""
    model = runtime.model
    tokenizer = Tokenizer.from_str(model.tokenizer_json.decode("utf-8"))
    prompts = args.prompt_token_ids
    eos = () if args.ignore_eos else model.settings.eos_token_ids
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                              seed=signed_seed(args.seed))
    # The seed is always chosen here (--seed, default 0): each prompt gets what that seed draws for it
    # alone, with or without other prompts and speculation beside it.
    results, stop = _run_batch(runtime.engine, prompts, args.output_limits, eos, sampling)
    try:
        for prompt, result in zip(prompts, results):
            text = _output_text(tokenizer, result.token_ids, () if getattr(args, "chat", False) else prompt,
                                model.prepared.contract.model.frontend.clean_up_tokenization_spaces)
            if args.json:
                print(json.dumps({"prompt_ids": prompt, "token_ids": list(result.token_ids), "text": text,
                                  "finish_reason": result.finish_reason.name.lower(), "message": result.message}))
            else:
                print(text)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader stopped early (`| head`): nothing more to say, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush has nowhere to fail
        return EXIT_BROKEN_PIPE
    failed = [r for r in results if r.finish_reason.name in ("ERROR", "REJECTED")]
    for result in failed:
        _say(f"{result.finish_reason.name.lower()}: {result.message}")
    if stop is not None:  # the prompts cut short end CANCELLED: no line each, this one says why
        finished = sum(r.finish_reason is not FinishReason.CANCELLED for r in results)
        how = "terminated" if isinstance(stop, Terminated) else "interrupted"
        _say(f"{how}: {finished} of {len(results)} prompts finished; the others' outputs are cut where they stopped")
        return stop.exit_code if isinstance(stop, Terminated) else EXIT_INTERRUPTED
    return 9 if failed else 0


def _say(line: str) -> None:
    """One line on standard error; none when it is closed (`2>&-`: print would write to stdout)."""
    if sys.stderr is not None:
        print(f"helios generate: {line}", file=sys.stderr)


def _run_batch(engine, prompts: list[list[int]], limits: list[int], eos, sampling: SamplingParams,
               ) -> tuple[list[Generation], BaseException | None]:
    """Runs every prompt as one request (`helios.runtime.offline.generate`, each with its seed
    pinned) until all end, or until SIGINT or SIGTERM (`Terminated` inside) stops the run: then the
    second value is that stop, and a prompt that had not ended is its tokens so far, CANCELLED. The
    outputs are kept here (`OfflineOutputs`), outside the engine's run, so that an interrupted batch
    still has them; the engine is left to `runtime.close`."""
    outputs = OfflineOutputs(prompts)
    stop = None
    try:
        with terminate_as_exception():
            offline.generate(engine, prompts, limits, eos, sampling, pinned_seed=True, outputs=outputs)
    except (KeyboardInterrupt, Terminated) as error:
        stop = error
    return outputs.generations(), stop  # a copy: what the shutdown's wind-down records later is not among them
