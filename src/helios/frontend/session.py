"""Request preparation for one served model: HTTP body in, `PreparedRequest` out.

`FrontendModel.from_contract(prepared, tokenizer, chat_template_source)` wires, once per model and
at startup, everything requests share: the contract's frontend syntax (`FrontendSyntax`), the
sandboxed chat template and prompt builder, the grammar compiler, EOS ids and the resolved
defaults. It is immutable and may be used by several preparation workers at once.

`prepare_chat(body, ingress_ns)` / `prepare_completion(body, ingress_ns)` run in a preparation
slot: they apply the combined-field rules (`request_options`), render and tokenize the prompt,
compile the output grammar (`grammar_request`: the structured answer and forced or limited tool
calls inside the reasoning/tool envelope the prompt leaves), resolve sampling (explicit request
values win over the prepared defaults) and the output limit, and return a frozen
`PreparedRequest`. Every invalid request raises a `RequestError` subclass (HTTP 400) here, before
admission. A `PreparedRequest` hands the engine its prompt ids, `GenerationParams` and grammar
matcher, and the output side an `OutputProcessor` factory and the response's presenters.
"""

from __future__ import annotations

import secrets
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Callable, NamedTuple, Sequence

from helios.contract import PreparedContract
from helios.contract import serving_pb2 as spb
from helios.contract.settings import ResolvedSettings
from helios.errors import ContractError, LoadError, RequestError
from helios.frontend.preparation.client_fields import effective_template_kwargs, thinking_switch_of
from helios.frontend.structured.contract_syntax import FrontendSyntax
from helios.frontend.decoding.detokenize import IncrementalDetokenizer, clean_up_tokenization, cleaned_parts
from helios.frontend.preparation.generation import (
    GenerationParams, is_seed_pinned, resolve_output_limit, resolve_sampling, scored_prompt_limit,
)
from helios.frontend.structured.grammar import GrammarCompiler, GrammarMatcher, parse_response_format
from helios.frontend.structured.grammar_request import OutputConstraints
from helios.frontend.preparation.image_parts import without_image_urls
from helios.frontend.images.decode import ImageLimits
from helios.frontend.images.pipeline import ImagePipeline
from helios.frontend.preparation.logit_bias import parse_logit_bias
from helios.frontend.decoding.logprobs import (
    LogprobRequest, PromptScoring, TokenTexts, check_logprobs_capability, echoed_token_texts, requested_logprobs,
    requested_prompt,
)
from helios.frontend.decoding.observation import ObservationOptions
from helios.frontend.responses.output import OutputFinal, OutputProcessor
from helios.frontend.parsers import AnswerMode, OutputPipeline, OutputRequest, ToolRegistry
from helios.frontend.parsers.pipeline import PlainText
from helios.frontend.responses.presentation import ResponseHead, ResponseKind, StreamPresenter, response_body
from helios.frontend.preparation.prompt import Prompt, PromptBuilder
from helios.frontend.preparation.prompt_images import (UnavailableImages, check_completion_prompt, check_image_parts,
                                                       with_images)
from helios.frontend.preparation.request_options import (
    ResponseOptions,
    has_structured_output,
    parse_body_stops,
    parse_chat_stops,
    parse_response_options,
    parse_tool_policy,
    requested_output_limit,
)
from helios.frontend.decoding.stops import StopOptions
from helios.frontend.preparation.template import ChatTemplate
from helios.frontend.decoding.text_bounds import TextBounds, strings_of
from helios.runtime.execution.images import RequestImages
from helios.runtime.records.request import RequestSpec


def call_id_prefix(request_id: str) -> str:
    """The prefix of the tool-call ids of request `request_id` (unique per request), where the core
    declares no random ids (`ModelFacts.tool_call_id_len`)."""
    return f"call_{request_id}_"


def random_seed() -> int:
    """Fresh seed bits for a request without a seed under the random seed policy."""
    return secrets.randbits(64)


class PromptError(RequestError):
    """A text-completion prompt that is empty or holds ids outside the input vocabulary."""

    param = "prompt"


class UnknownModel(RequestError):
    """The body names a model this server does not serve."""

    param = "model"


class RequestedOutput(NamedTuple):
    """A body's explicit output limit (None: up to the rest of the context) and the fields an error
    about the context extent names."""

    tokens: int | None
    field: str  # max_tokens or max_completion_tokens: the one the body gave
    prompt_field: str  # messages or prompt


@dataclass(frozen=True)
class ModelFacts:
    """Served names and vocabulary geometry of one model."""

    served_names: tuple[str, ...]  # the served id first, then its aliases
    vocab_size: int  # one past the largest sampled id (mask and stop-id range)
    input_range: tuple[int, int]  # valid prompt ids [begin, end)
    token_logprobs: int = 0  # alternatives per token the core's token-logprobs programs return (0: none)
    scores_prompts: bool = False  # the core has a scored-prefill program
    logit_bias: int = 0  # logit-bias entries the core's programs take per request (0: none)
    tool_call_id_len: int = 0  # random alphanumeric tool-call ids of this length (0: `call_id_prefix` ids)
    clean_up_spaces: bool = False  # output text gets transformers' tokenization-space cleanup


@dataclass(frozen=True)
class OutputFactory:
    """Immutable parts of one request's output path; `create` builds a fresh `OutputProcessor`."""

    tokenizer: Any
    frontend: FrontendSyntax | None  # None: plain text (text completions)
    request: OutputRequest | None
    stops: StopOptions
    eos_token_ids: tuple[int, ...]
    observation: ObservationOptions
    prompt_token_ids: tuple[int, ...] = field(repr=False)
    ingress_ns: int | None
    token_texts: TokenTexts | None = None  # set when the request asks for log-probabilities
    prompt_scoring: PromptScoring | None = None  # echo, prompt scores, max_tokens 0
    continues_prompt: bool = False  # a grammar constrains the output, or it continues the final message
    clean_up_spaces: bool = False  # the core's `clean_up_tokenization_spaces`: the detokenizer cleans

    def for_choice(self, request_id: str) -> OutputFactory:
        """This output path for another choice of the request, `request_id`: its tool-call ids are its own."""
        if self.request is None:
            return self
        return replace(self, request=replace(self.request, call_id_prefix=call_id_prefix(request_id)))

    def create(self) -> OutputProcessor:
        if self.frontend is None:
            pipeline = OutputPipeline(PlainText())
        else:
            pipeline = OutputPipeline.create(self.frontend.output, self.frontend.delimiters, self.request)
        # A text completion continues its prompt, and so does a chat output continuing the final
        # message (`continue_final_message`); a constrained output is the text its grammar matched:
        # decoded as the first token of a sequence, a SentencePiece ▁ word would lose the leading
        # space the grammar saw (a regex " \d" answered "3") or the message's text ran into.
        continues = self.frontend is None or self.continues_prompt
        return OutputProcessor(
            IncrementalDetokenizer(self.tokenizer, skip_special_tokens=False,
                                   context_ids=self.prompt_token_ids if continues else (),
                                   clean_up_spaces=self.clean_up_spaces),
            pipeline,
            self.stops.new_matcher(),
            self.eos_token_ids,
            self.observation,
            self.prompt_token_ids,
            self.ingress_ns,
            self.token_texts,
            self.prompt_scoring,
        )


@dataclass(frozen=True)
class PreparedRequest:
    """A validated, tokenized request. The grammar matcher (None when unconstrained) is mutable
    state: the model worker owns it once the request is submitted and advances it with
    ``consume_token`` after each completion, before computing the next mask."""

    request_id: str
    head: ResponseHead
    prompt_token_ids: tuple[int, ...] = field(repr=False)
    params: GenerationParams
    grammar: GrammarMatcher | None
    stable_prefix_len: int
    output: OutputFactory = field(repr=False)
    images: RequestImages | None = field(default=None, kw_only=True, repr=False)

    def new_output(self) -> OutputProcessor:
        return self.output.create()

    def for_choice(self, request_id: str, grammar: GrammarMatcher | None) -> PreparedRequest:
        """Another choice of the same body (``n`` > 1) under `request_id`, with `grammar` (a matcher
        of its own, `FrontendModel.prepare_choice`), without preparing it again: the prompt, images
        and head are shared; its tool-call ids are its own."""
        return replace(self, request_id=request_id, grammar=grammar, output=self.output.for_choice(request_id))

    def new_stream(self) -> StreamPresenter:
        return StreamPresenter(self.head)

    def response_body(self, final: OutputFinal) -> dict:
        return response_body(self.head, final)

    def request_spec(self, **scheduling) -> RequestSpec:
        scheduling = {"stable_prefix_len": self.stable_prefix_len, **scheduling}
        if self.images is not None:  # prefix caching keys image features by their image's content hash
            scheduling = {**scheduling, "token_keys": self.images.token_keys()}
        return self.params.request_spec(self.request_id, self.prompt_token_ids, **scheduling)


@dataclass(frozen=True)
class PreparedChat(PreparedRequest):
    """A chat request; `prompt` also holds the rendered text and the initial reasoning state."""

    prompt: Prompt = field(kw_only=True, repr=False)


@dataclass(frozen=True)
class PreparedCompletion(PreparedRequest):
    """A text completion request (raw text out: no reasoning or tool parsing)."""


class FrontendModel:
    """Per-model frontend state; immutable after construction and shared by preparation workers."""

    def __init__(
        self,
        tokenizer,
        syntax: FrontendSyntax,
        prompts: PromptBuilder,
        grammar: GrammarCompiler,
        settings: ResolvedSettings,
        facts: ModelFacts,
        draw_seed: Callable[[], int] = random_seed,
        thinking_switch: str | None = None,
        images: ImagePipeline | UnavailableImages | None = None,
    ):
        self._tokenizer = tokenizer
        self._thinking_switch = thinking_switch  # the template argument reasoning_effort sets
        self._syntax = syntax
        self._prompts = prompts
        self._grammar = grammar
        self._constraints = OutputConstraints.for_tokenizer(syntax, grammar, tokenizer)
        self._settings = settings
        self._facts = facts
        self._draw_seed = draw_seed
        self._text_bounds = TextBounds.from_tokenizer(tokenizer, settings.context_tokens)
        self._images = images
        self._token_texts = TokenTexts(tokenizer, grammar.token_bytes)

    @classmethod
    def from_contract(
        cls,
        prepared: PreparedContract,
        tokenizer,
        chat_template_source: str,
        *,
        settings: ResolvedSettings | None = None,
        json_defaults: dict | None = None,
        draw_seed: Callable[[], int] | None = None,
        served_names: Sequence[str] = (),
        image_limits: ImageLimits = ImageLimits(),
        grammar: GrammarCompiler | None = None,
    ) -> FrontendModel:
        """Startup wiring; ContractError when the contract and tokenizer disagree, TemplateLoadError
        when the template does not compile. `settings` default to the core's own defaults;
        `served_names` (operator names: the served id, then aliases) replace the contract's;
        `grammar`: the compiler already built from `tokenizer` for the sampled vocabulary, the
        settings' end-of-sequence ids and `json_defaults` (None: built here)."""
        serving = prepared.contract

        def encode(text: str) -> list[int]:
            return tokenizer.encode(text, add_special_tokens=False).ids

        syntax = FrontendSyntax.from_contract(serving.model.frontend, encode)
        check_template_tokens(serving.defaults.template_tokens, encode)
        template = ChatTemplate(chat_template_source, {t.name: t.text for t in serving.defaults.template_tokens})
        settings = settings or prepared.defaults
        vocab_size = prepared.sampled_range[1]
        if grammar is None:
            grammar = GrammarCompiler.from_tokenizer(
                tokenizer, vocab_size=vocab_size, eos_token_ids=settings.eos_token_ids, json_defaults=json_defaults
            )
        names = tuple(served_names) or (serving.served_id, *serving.aliases)
        logprobs = min((g.token_logprobs for g in prepared.graphs.values() if g.token_logprobs), default=0)
        scored = bool(prepared.graphs_for(spb.GRAPH_OPERATION_SCORED_PREFILL))
        facts = ModelFacts(names, vocab_size, prepared.input_range, logprobs, scored, prepared.logit_bias_width,
                           serving.model.frontend.tool_call_id_len,
                           serving.model.frontend.clean_up_tokenization_spaces)
        prompts = PromptBuilder(template, tokenizer, syntax.prompt_rules)
        try:
            images = ImagePipeline.from_contract(serving.model, image_limits)
        except LoadError as error:  # text still serves; image parts get a 400 naming the reason
            images = UnavailableImages(str(error))
        return cls(tokenizer, syntax, prompts, grammar, settings, facts, draw_seed or random_seed,
                   thinking_switch_of(chat_template_source), images)

    @property
    def served_id(self) -> str:
        return self._facts.served_names[0]

    @property
    def syntax(self) -> FrontendSyntax:
        return self._syntax

    @property
    def settings(self) -> ResolvedSettings:
        return self._settings

    def prepare_chat(self, body, ingress_ns: int | None = None, *, request_id: str | None = None,
                     created: int | None = None) -> PreparedChat:
        """Validates and prepares one `ChatCompletionRequest` body (RequestError on bad input)."""
        self._check_model(body.model)
        response = parse_response_options(body)
        _check_ingress(response, ingress_ns)
        policy = parse_tool_policy(body)
        stops = parse_chat_stops(body, self._facts.vocab_size)
        requested = RequestedOutput(
            requested_output_limit(body),
            "max_completion_tokens" if getattr(body, "max_completion_tokens", None) is not None else "max_tokens",
            "messages")
        # Declared tools are rendered whatever the tool choice (vLLM's default since 0.10, and what
        # /tokenize counts): under ``none`` the model still knows them, but no call is parsed or allowed.
        declared = [tool.model_dump(exclude_none=True) for tool in body.tools] if body.tools else None
        tools = declared if policy.is_active else None
        prompt, images = self.chat_prompt(body, declared, getattr(body, "reasoning_effort", None))
        answer = None
        if has_structured_output(body):
            answer = parse_response_format(body.response_format.model_dump(by_alias=True, exclude_none=True))
        limit = self._output_limit(requested, len(prompt.token_ids))
        grammar = self._constraints.compile(answer, policy, tools, prompt, reasoning_budget=limit // 2)
        request_id = request_id or uuid.uuid4().hex
        output_request = OutputRequest(
            ToolRegistry.from_openai(tools),
            call_id_prefix=call_id_prefix(request_id),
            start=self._syntax.output_start(prompt),
            answer=AnswerMode.STRUCTURED if answer is not None else AnswerMode.FREE,
            call_id_len=self._facts.tool_call_id_len,
        )
        logprobs = self._logprobs(body, is_chat=True)
        params = self._params(body, stops, requested, len(prompt.token_ids), grammar is not None, response, logprobs)
        head = self._head(f"chatcmpl-{request_id}", created, ResponseKind.CHAT, response, prompt.token_ids,
                          logprobs)
        factory = self._factory(self._syntax, output_request, stops, response, prompt.token_ids, ingress_ns,
                                logprobs, continues_prompt=grammar is not None or prompt.continues_message)
        return PreparedChat(
            request_id, head, prompt.token_ids, params, grammar, prompt.stable_prefix_len, factory, prompt=prompt,
            images=images,
        )

    def chat_prompt(self, body, tools: list[dict] | None,
                    reasoning_effort: str | None = None) -> tuple[Prompt, RequestImages | None]:
        """The prompt of a chat body's messages (and its images' features: None for text only) with
        `tools` rendered (None: none), as a chat completion renders it: the messages' text bound,
        their image parts, the template under the body's `chat_template_kwargs` (and
        `reasoning_effort`'s switch), `add_generation_prompt` and `continue_final_message`, then
        the image placeholders expanded. `/tokenize` answers these ids."""
        messages = [message.model_dump(exclude_none=True) for message in body.messages]
        template_kwargs = effective_template_kwargs(reasoning_effort, body.chat_template_kwargs, self._thinking_switch)
        self._text_bounds.check(strings_of([without_image_urls(messages), tools, template_kwargs]), "messages")
        check_image_parts(messages, self._images)
        prompt = self._prompts.build(messages, tools, template_kwargs=template_kwargs,
                                     add_generation_prompt=body.add_generation_prompt,
                                     continue_final_message=body.continue_final_message)
        return with_images(prompt, self._images)

    def text_prompt(self, text: str, add_special_tokens: bool = True) -> tuple[int, ...]:
        """The ids of a text prompt, as a completion tokenizes it (its text bound checked first: the
        tokenizer takes seconds over megabytes no context could hold)."""
        self._text_bounds.check([text], "prompt")
        return tuple(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode_ids(self, token_ids: Sequence[int]) -> str:
        """The text of `token_ids` as an echo of an id prompt shows it: special tokens kept, cleaned
        up on a core that cleans up tokenization spaces (transformers' decode)."""
        text = self._tokenizer.decode(list(token_ids), skip_special_tokens=False)
        return clean_up_tokenization(text) if self._facts.clean_up_spaces else text

    @property
    def tokenizer(self):
        """The core's tokenizer (`tokenizers.Tokenizer`); shared, read only."""
        return self._tokenizer

    def prepare_choice(self, prepared: PreparedRequest, request_id: str) -> PreparedRequest:
        """Another choice of the request `prepared` (``n`` > 1) under `request_id`, without rendering,
        tokenizing or checking it again (`PreparedRequest.for_choice`). Its grammar matcher is compiled
        again from the first's source and started as the first's was, as an engine process compiles
        each request's: a fork of the first's matcher would share its lexer, whose limits then count
        every choice's work (a choice met a grammar limit sooner than alone)."""
        grammar = None
        if prepared.grammar is not None:
            grammar = self._grammar.compile_source(prepared.grammar.source)
            grammar.bitmask()  # its first mask, as `GrammarCompiler` starts a request's matcher
        return prepared.for_choice(request_id, grammar)

    def prepare_completion(self, body, ingress_ns: int | None = None, *, request_id: str | None = None,
                           created: int | None = None) -> PreparedCompletion:
        """Validates and prepares one `CompletionRequest` body (RequestError on bad input)."""
        self._check_model(body.model)
        response = parse_response_options(body)
        _check_ingress(response, ingress_ns)
        stops = parse_body_stops(body, self._facts.vocab_size)
        logprobs = self._logprobs(body, is_chat=False)
        prompt_ids = self._completion_prompt(body.prompt)
        requested = RequestedOutput(body.max_tokens, "max_tokens", "prompt")
        params = self._params(body, stops, requested, len(prompt_ids), False, response, logprobs)
        request_id = request_id or uuid.uuid4().hex
        echo = self._echo_text(body.prompt, prompt_ids) if logprobs.prompt.echo else None
        head = self._head(f"cmpl-{request_id}", created, ResponseKind.TEXT, response, prompt_ids, logprobs, echo)
        factory = self._factory(None, None, stops, response, prompt_ids, ingress_ns, logprobs)
        return PreparedCompletion(request_id, head, prompt_ids, params, None, 0, factory)

    def _check_model(self, name: str) -> None:
        if name not in self._facts.served_names:
            raise UnknownModel(f"model {name!r} is not served here; use {self.served_id!r}")

    def _completion_prompt(self, prompt: str | Sequence[int]) -> tuple[int, ...]:
        if isinstance(prompt, str):
            ids = self.text_prompt(prompt)
        else:
            begin, end = self._facts.input_range
            if any(not begin <= token < end for token in prompt):
                raise PromptError(f"prompt token ids must lie in [{begin}, {end})")
            ids = tuple(prompt)
        if not ids:
            raise PromptError("the prompt is empty")
        check_completion_prompt(ids, self._images, self._tokenizer.id_to_token)
        return ids

    def _logprobs(self, body, is_chat: bool) -> LogprobRequest:
        """The log-probabilities the body asks for; a 400 when the core cannot compute them."""
        prompt = requested_prompt(body, is_chat, self._facts.scores_prompts, is_vision=self._images is not None)
        requested = None if prompt.hides_output else requested_logprobs(body, is_chat)  # no output: nothing to score
        check_logprobs_capability(requested, self._facts.token_logprobs, is_chat)
        return LogprobRequest(requested, prompt)

    def _echo_text(self, prompt: str | Sequence, prompt_ids: tuple[int, ...]) -> str:
        """The prompt as ``echo`` returns it: the text given, or the ids decoded (cleaned up as the
        output is, on a core that cleans up tokenization spaces: transformers' decode)."""
        return prompt if isinstance(prompt, str) else self.decode_ids(prompt_ids)

    def _echoed_token_texts(self, prompt_ids: tuple[int, ...], echo_text: str) -> tuple[str, ...]:
        """Each prompt token's part of `echo_text` (`echoed_token_texts`). An echo cleaned up as
        transformers' decodes (`_echo_text`) gets the raw decode's parts, each cleaned in turn
        (`cleaned_parts`): aligning the raw parts to the cleaned text gave every token between
        their first and last difference no text."""
        if self._facts.clean_up_spaces:
            raw = self._tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
            if raw != echo_text and clean_up_tokenization(raw) == echo_text:
                return cleaned_parts(echoed_token_texts(self._tokenizer, prompt_ids, raw))
        return echoed_token_texts(self._tokenizer, prompt_ids, echo_text)

    def _output_limit(self, requested: RequestedOutput, prompt_len: int) -> int:
        """`resolve_output_limit` for `requested`; its 400 names the field the body sent."""
        return resolve_output_limit(requested.tokens, self._settings.sampling.max_output_tokens,
                                    self._settings.context_tokens, prompt_len, requested.field, requested.prompt_field)

    def _params(self, body, stops: StopOptions, requested: RequestedOutput, prompt_len: int, is_constrained: bool,
                response: ResponseOptions, logprobs: LogprobRequest = LogprobRequest()) -> GenerationParams:
        eos_token_ids = self._settings.eos_token_ids
        if logprobs.prompt.hides_output:
            # The prefill samples one token anyway and the output hides it: it ends the request at
            # its limit (`length`), never as an end of sequence that nobody sees. Never fed back, it
            # needs no room: a prompt of the whole context is scored.
            max_output_tokens = scored_prompt_limit(self._settings.context_tokens, prompt_len, requested.prompt_field)
            eos_token_ids = ()
        else:
            max_output_tokens = self._output_limit(requested, prompt_len)
        defaults = self._settings.sampling
        return GenerationParams(
            sampling=resolve_sampling(body, defaults, self._draw_seed),
            max_output_tokens=max_output_tokens,
            eos_token_ids=eos_token_ids,
            stop_strings=stops.strings,
            stop_token_sequences=tuple((t,) for t in stops.token_ids) + stops.token_sequences,
            is_constrained=is_constrained,
            is_timed=response.observation.is_timed,
            top_logprobs=logprobs.top_logprobs,
            score_prompt=logprobs.prompt.scores,
            logit_bias=parse_logit_bias(body.logit_bias, self._facts.vocab_size, self._facts.logit_bias),
            pinned_seed=is_seed_pinned(body, defaults),
        )

    def _head(self, response_id: str, created: int | None, kind: ResponseKind, response: ResponseOptions,
              prompt_ids: tuple[int, ...], logprobs: LogprobRequest, echo_text: str | None = None) -> ResponseHead:
        created = int(time.time()) if created is None else created
        echo_token_texts = None
        if echo_text is not None and logprobs.prompt.echo_logprobs is not None:
            echo_token_texts = self._echoed_token_texts(prompt_ids, echo_text)
        return ResponseHead(response_id, created, self.served_id, kind, response, prompt_ids, logprobs.prompt,
                            echo_text, echo_token_texts)

    def _factory(self, syntax: FrontendSyntax | None, request: OutputRequest | None, stops: StopOptions,
                 response: ResponseOptions, prompt_ids: tuple[int, ...], ingress_ns: int | None,
                 logprobs: LogprobRequest, *, continues_prompt: bool = False) -> OutputFactory:
        prompt = logprobs.prompt
        scoring = None
        if prompt.scores or prompt.hides_output:
            scoring = PromptScoring(self._token_texts, prompt.num_top, not prompt.hides_output, prompt.scores)
        return OutputFactory(
            self._tokenizer, syntax, request, stops,
            self._settings.eos_token_ids, response.observation, prompt_ids, ingress_ns,
            self._token_texts if logprobs.top_logprobs is not None else None, scoring, continues_prompt,
            self._facts.clean_up_spaces,
        )


def _check_ingress(response: ResponseOptions, ingress_ns: int | None) -> None:
    if response.observation.is_timed and ingress_ns is None:
        raise ValueError("a timed request needs its ingress timestamp (stamp_ingress at handler entry)")


def check_template_tokens(tokens, encode: Callable[[str], Sequence[int]]) -> None:
    """Each declared template token's text must encode as exactly its declared id."""
    for i, token in enumerate(tokens):
        ids = list(encode(token.text))
        if ids != [token.token_id]:
            raise ContractError(
                f"contract.defaults.template_tokens[{i}].token_id",
                f"declares {token.token_id} but the tokenizer encodes {token.text!r} as {ids}",
            )
