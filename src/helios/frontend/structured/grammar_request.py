"""Which grammar constrains a chat request's output, compiled during preparation.

`OutputConstraints` (one per served model, immutable, shared by preparation workers) turns a
request's answer grammar (``response_format``), its `ToolPolicy` and the prompt's starting state into
the request's `GrammarMatcher`, or None for unconstrained output:

- no active tools, or tools under ``auto`` with parallel calls and no ``response_format``: the
  answer grammar inside the reasoning envelope (`grammar.envelope_lark`), or recipient or harmony
  frames around it (`grammar_frames`, `grammar_channels`); None without an answer grammar;
- otherwise one grammar for calls and the answer (`grammar_tools` for tag syntaxes,
  `grammar_frames` for recipient frames, `grammar_channels` for harmony frames, where a call ends
  the output so at most one is written, `grammar_json_calls` for JSON calls): ``required`` and a
  named function allow only calls (the named one: exactly one call of it),
  ``parallel_tool_calls=false`` at most one call, and the answer is the structured one or, without
  ``response_format``, free text. JSON-call syntaxes (whose parser reads no call in a structured
  answer) constrain the answer alone under ``response_format`` with optional calls.

Whenever a grammar with calls is built, each callable tool's parameters schema is checked first
(`ToolSchema.parameters_request`), all of them in one `GrammarCompiler.first_failure` (one cached
verdict, one bound on the patterns probed): one that cannot constrain its arguments is a
`GrammarError` (HTTP 400) naming the tool. Tools that no grammar constrains (``auto`` without one) are not checked.

Requests that cannot be honoured raise `ChatOptionError` (HTTP 400): forcing calls on a model whose
output syntax has no tool calls, or when no forced tool has a name the syntax can spell.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Iterator, Mapping, Sequence

from helios.frontend.structured.contract_syntax import FrontendSyntax
from helios.frontend.structured.grammar import (GrammarCompiler, GrammarError, GrammarKind, GrammarMatcher,
                                               GrammarRequest)
from helios.frontend.structured.grammar_channels import channels_lark
from helios.frontend.structured.grammar_frames import frames_lark
from helios.frontend.structured.grammar_json_calls import json_calls_lark, optional_call_lark
from helios.frontend.structured.grammar_lark import Speller
from helios.frontend.structured.grammar_tools import AnswerKind, CallPolicy, TagEnvelope, ToolSchema, is_markup_name, tag_tool_lark
from helios.frontend.preparation.prompt import Prompt, ReasoningState
from helios.frontend.preparation.request_options import ChatOptionError, ToolChoiceMode, ToolPolicy
from helios.frontend.decoding.syntax import ToolSyntaxKind


class OutputConstraints:
    """Compiles request grammars for one model's frontend syntax."""

    def __init__(self, syntax: FrontendSyntax, compiler: GrammarCompiler, speller: Speller):
        self._syntax = syntax
        self._compiler = compiler
        self._speller = speller

    @classmethod
    def for_tokenizer(cls, syntax: FrontendSyntax, compiler: GrammarCompiler, tokenizer) -> OutputConstraints:
        return cls(syntax, compiler, Speller.from_tokenizer(tokenizer, compiler.is_special_token, syntax.delimiters))

    def compile(self, answer: GrammarRequest | None, policy: ToolPolicy,
                tools: Sequence[Mapping[str, Any]] | None, prompt: Prompt,
                reasoning_budget: int | None = None) -> GrammarMatcher | None:
        """The request's matcher (None: unconstrained). GrammarError / ChatOptionError: HTTP 400.
        `reasoning_budget` bounds a reasoning section ahead of an answer-only structured output."""
        calls = self._call_policy(answer, policy, tools) if policy.is_active and (answer is not None or policy.needs_grammar) else None
        if calls is None:
            if answer is None:
                return None
            with _fault_of("response_format"):
                return self._answer_only(answer, prompt, reasoning_budget)
        syntax = self._syntax  # a tag syntax writes each parameter on its own (`ToolSchema.parameters_request`)
        self._check_tools(calls.tools, syntax.output.tool_kind is ToolSyntaxKind.JSON_CALLS or syntax.has_channels)
        if answer is not None:
            with _fault_of("response_format"):
                if calls.answer is AnswerKind.STRUCTURED:
                    self._compiler.check(answer)  # compile_lark checks it again: a cached verdict
                else:
                    self._compiler.compile(answer)  # forced calls leave no answer, but the format must be valid
        syntax, options = self._syntax, self._compiler.json_options
        if syntax.output.tool_kind is ToolSyntaxKind.JSON_CALLS:  # no structured answer here (see _call_policy)
            if calls.answer is AnswerKind.FREE:  # parallel_tool_calls=false: text, or text then one call
                lark = optional_call_lark(syntax.output.tools, self._speller, calls.tools, options,
                                          self._answer_avoids(prompt))
                reasoning_budget = None  # a free answer needs no room kept: reasoning runs as unconstrained
            else:
                lark = json_calls_lark(syntax.output.tools, self._speller, calls.tools, calls.single_call, options)
            with _fault_of("tools"):
                return self._answer_only(GrammarRequest(GrammarKind.LARK, lark), prompt, reasoning_budget)
        if syntax.has_frames:
            start = syntax.output_start(prompt).frame
            lark = frames_lark(syntax.output.frames, self._speller, start, calls, calls.answer, options)
        elif syntax.has_channels:
            start = syntax.output_start(prompt).frame
            lark = channels_lark(syntax.output.channels, self._speller, start, calls, calls.answer, options,
                                 reasoning_budget)
        else:
            lark = tag_tool_lark(syntax.output, self._speller, TagEnvelope(prompt.reasoning_state, calls), options)
        with _fault_of("tools"):  # the answer grammar passed its own check above: the calls' grammar failed
            return self._compiler.compile_lark(lark, answer if calls.answer is AnswerKind.STRUCTURED else None)

    def _check_tools(self, tools: Sequence[ToolSchema], one_value: bool = True) -> None:
        """GrammarError naming the first tool whose parameters schema cannot constrain its arguments.
        The schemas are checked together (`GrammarCompiler.first_failure`): one cached verdict per
        tool set, and one bound on the patterns probed for all of them. `one_value`: the syntax writes
        the arguments as one JSON value (`ToolSchema.parameters_request`)."""
        requests = []
        for tool in tools:
            try:
                requests.append(tool.parameters_request(one_value))
            except GrammarError as error:
                raise GrammarError(f"tool {tool.name!r} parameters: {error}", tool.param) from None
        failure = self._compiler.first_failure(requests)
        if failure is not None:
            index, error = failure
            raise GrammarError(f"tool {tools[index].name!r} parameters: {error}", tools[index].param)

    def _answer_only(self, answer: GrammarRequest, prompt: Prompt, budget: int | None) -> GrammarMatcher:
        syntax = self._syntax
        if syntax.has_frames:
            start = syntax.output_start(prompt).frame
            lark = frames_lark(syntax.output.frames, self._speller, start, None, AnswerKind.STRUCTURED,
                               self._compiler.json_options)
            return self._compiler.compile_lark(lark, answer)
        if syntax.has_channels:
            start = syntax.output_start(prompt).frame
            lark = channels_lark(syntax.output.channels, self._speller, start, None, AnswerKind.STRUCTURED,
                                 self._compiler.json_options, None if budget is None else max(1, budget))
            return self._compiler.compile_lark(lark, answer)
        envelope = syntax.envelope(prompt.reasoning_state)
        if envelope is not None and budget is not None:
            envelope = replace(envelope, budget=max(1, budget))
        return self._compiler.compile(answer, envelope)

    def _answer_avoids(self, prompt: Prompt) -> list:
        """Spellings free answer text never writes: the reasoning opener where the prompt left
        reasoning unopened (the reasoning parser reads it there as opening reasoning), as the tag
        grammars' free text avoids it."""
        think = self._syntax.output.think
        if think is None or prompt.reasoning_state is not ReasoningState.UNOPENED:
            return []
        return [self._speller(think.open)]

    def _call_policy(self, answer: GrammarRequest | None, policy: ToolPolicy,
                     tools: Sequence[Mapping[str, Any]] | None) -> CallPolicy | None:
        """The calls the grammar allows; None when no tool can be called (answer only). A JSON-call
        syntax with a ``response_format`` and optional calls constrains the answer alone, under
        ``parallel_tool_calls=false`` too (a 400 before): its parser reads a structured answer as
        answer text (`json_calls`, `AnswerMode.STRUCTURED`), so no call is written to count."""
        callable_tools = ToolSchema.from_openai(tools)
        if policy.mode is ToolChoiceMode.NAMED:
            callable_tools = tuple(tool for tool in callable_tools if tool.name == policy.function)
        spelled = tuple(tool for tool in callable_tools if is_markup_name(tool.name))
        json_calls = self._syntax.output.tool_kind is ToolSyntaxKind.JSON_CALLS
        if json_calls and answer is not None and not policy.forces_call:
            return None
        if self._syntax.output.tool_kind is ToolSyntaxKind.NONE or not spelled:
            if policy.needs_grammar:
                raise ChatOptionError(self._unforceable(policy, callable_tools),
                                      "tool_choice" if policy.forces_call else "parallel_tool_calls")
            return None
        if policy.forces_call:
            kind = AnswerKind.NONE
        else:
            kind = AnswerKind.STRUCTURED if answer is not None else AnswerKind.FREE
        single = policy.mode is ToolChoiceMode.NAMED or not policy.parallel or self._syntax.has_channels
        return CallPolicy(spelled, kind, single)

    def _unforceable(self, policy: ToolPolicy, tools: Sequence[ToolSchema]) -> str:
        option = "parallel_tool_calls=false" if not policy.forces_call else f"tool_choice {policy.mode.value!r}"
        if self._syntax.output.tool_kind is ToolSyntaxKind.NONE:
            return f"{option} cannot be honoured: this model's output syntax has no tool calls"
        names = ", ".join(repr(tool.name) for tool in tools)
        return f"{option} cannot be honoured: the tool syntax cannot spell the function names {names}"


@contextmanager
def _fault_of(param: str) -> Iterator[None]:
    """A `GrammarError` raised inside that names no field names `param`."""
    try:
        yield
    except GrammarError as error:
        if error.param is not None:
            raise
        raise GrammarError(str(error), param) from None
