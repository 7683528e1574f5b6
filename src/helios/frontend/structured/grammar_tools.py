"""Tool calls and structured answers in one llguidance grammar, inside the reasoning/tool envelope.

When a request's tools meet a ``response_format`` or a forcing option (``tool_choice`` required or a
named function, ``parallel_tool_calls=false``), the whole output is constrained by one grammar:

    [reasoning, as the prompt left it]  then  tool-call blocks  |  the answer

- reasoning follows the think syntax: free (or, for XTML, escaped) text up to the close delimiter,
  generated as its token when the tokenizer has one; a terminal marker (the tool opener) may end it
  and open the first block directly. UNOPENED prompts may open reasoning; CLOSED and NO_REASONING
  prompts start with the body;
- tool-call blocks use the declared tool syntax (`ToolGrammar`, the parsers' own compiled
  spellings): invocation names are the policy's tools, parameters follow each tool's JSON schema in
  declared order (required ones always written) with values typed as the parsers read them
  (`grammar_values`). Qwen Coder and GLM write one call per block, DSML and XTML all calls in one
  block. After the last block only whitespace may follow;
- the answer is, by `AnswerKind`: STRUCTURED, the ``response_format`` grammar as an opaque
  subgrammar (``@answer``), so tags spelled inside it stay answer text; FREE, text that never spells
  the tool opener (nor, at a line start, an invocation tag the parser reads there as a call without
  it: Qwen Coder's ``<function=``, `ToolGrammar.bare_invocations`), optionally followed by calls;
  NONE, absent (a call is required).

A tool whose parameters schema would constrain the output must compile on its own
(`ToolSchema.parameters_request`, checked by `GrammarCompiler.first_failure` before the grammar is built): an
object schema (OpenAI's rule for ``parameters``), known types, patterns that compile and stay within
llguidance's limits; unsupported keywords are still ignored (llguidance ``lenient``). Failures are
`GrammarError`s (HTTP 400) naming the tool; so is a top-level ``anyOf``/``oneOf``/``allOf``, which
a tag syntax writing one parameter at a time cannot hold (`ToolSchema.unheld_combinator`), in the one
tool an output must call (`CallPolicy.forces_one_tool`; in a tool the model may choose it is left out). JSON
values take the tool's own ``x-guidance`` options (``whitespace_flexible``) over the server's, as in
JSON-call syntaxes (`CallGrammar._values_of`). Every keyword llguidance implements is enforced, whether
or not the tool says ``strict``: in JSON values by llguidance, in raw string values ``minLength``,
``maxLength`` and ``pattern`` by `grammar_values` (its docstring gives the few limits, each a 400
naming the parameter, and ``format``, which raw text does not get).

`CallPolicy` is the request's side: the callable tools (the registered ones, or only the named
function), the answer kind and whether at most one call is allowed. `CallGrammar` builds invocation
rules for one tool syntax and is shared with the recipient-frame grammar (`grammar_frames`).
Builders mutate only the `LarkRules` they are given.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from helios.frontend.structured.grammar import GrammarError, GrammarKind, GrammarRequest
from helios.frontend.structured.grammar_lark import (
    ANY_TEXT, LarkRules, Speller, Spelling, avoiding, free_text, join, lark_of, regex_escape, spelled_text,
    text_spelling, text_then,
)
from helios.frontend.structured.grammar_options import OPTIONS_KEY, client_options, option_error
from helios.frontend.structured.grammar_values import ValueGrammar, ValueStyle
from helios.frontend.parsers.pipeline import tool_grammar
from helios.frontend.parsers.scan import FORBIDDEN_IN_CAPTURE, MAX_CAPTURE_LEN
from helios.frontend.parsers.schema_refs import SchemaDocument
from helios.frontend.parsers.tool_grammar import ToolGrammar
from helios.frontend.parsers.values import tool_document, tool_param, tool_properties
from helios.frontend.preparation.prompt import ReasoningState
from helios.frontend.decoding.syntax import OutputSyntax, ReasoningSyntaxKind, ThinkSyntax, ToolSyntaxKind

ANSWER_RULE = "@answer"
WHITESPACE = "/[ \\t\\r\\n]{1,4}/"
_ONE_CALL_PER_BLOCK = (ToolSyntaxKind.QWEN_CODER_FUNCTIONS, ToolSyntaxKind.GLM_ARGUMENTS)


class AnswerKind(enum.Enum):
    NONE = "none"  # no answer: the output is tool calls
    FREE = "free"  # free text, optionally followed by calls
    STRUCTURED = "structured"  # the response_format grammar, or calls


def is_markup_name(name: str, forbidden: frozenset[str] = FORBIDDEN_IN_CAPTURE) -> bool:
    """Whether the tag parsers can read ``name`` as an invocation or parameter name: it holds none of
    its syntax's ``forbidden`` characters (a name captured inside a tag, by default: none of ``<>"``
    nor a newline; GLM's keys written as text between tags: ``<`` only; Qwen3-Coder's parameter
    names, written up to the tag's ``>``: ``<`` and ``>``)."""
    return bool(name) and name == name.strip() and len(name) <= MAX_CAPTURE_LEN and not (set(name) & forbidden)


@dataclass(frozen=True)
class ToolSchema:
    """A callable function: its name and its arguments' JSON schema (an object schema).

    ``document`` is that schema checked for local refs (`SchemaRefError`, HTTP 400, otherwise);
    property values are read through it, the way the output parsers type them.
    """

    name: str
    parameters: Mapping[str, Any] = field(default_factory=dict)
    index: int | None = field(default=None, compare=False)  # its place in the request's ``tools``
    document: SchemaDocument = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "document", tool_document(self.name, self.parameters, self.index))

    @property
    def param(self) -> str:
        """The request field of its parameters schema (``tools[i].function.parameters``; ``tools``
        without an index), which its schema errors name."""
        return tool_param(self.index)

    @classmethod
    def from_openai(cls, tools: Sequence[Mapping[str, Any]] | None) -> tuple[ToolSchema, ...]:
        out = []
        for index, tool in enumerate(tools or ()):
            function = tool.get("function") or {}
            if tool.get("type", "function") == "function" and function.get("name"):
                parameters = function.get("parameters")
                out.append(cls(function["name"], parameters if isinstance(parameters, Mapping) else {}, index))
        return tuple(out)

    @property
    def object_parameters(self) -> dict[str, Any]:
        """The parameters schema held to a JSON object at its top level (arguments are one): its
        ``type`` is "object" (absent, or a list holding it, before; `parameters_request` refuses any
        other), which the top level's other keywords (``anyOf``, ``$ref``, ``enum`` ...) then meet.
        A schema whose top level allows only other values cannot be satisfied: a 400, where a JSON
        call or harmony grammar wrote arguments such as ``null`` or ``"x"``, which no parser reads."""
        return {**self.parameters, "type": "object"}

    def parameters_request(self, one_value: bool = True) -> GrammarRequest:
        """The parameters schema as a lenient JSON-schema grammar of an object (what
        `GrammarCompiler.check` tries); GrammarError when its top level is no object schema, or its
        ``x-guidance`` sets an option a client may not (`grammar_options`). `one_value`: the syntax
        writes the arguments as one JSON value (JSON calls, harmony); a tag syntax (False) writes each
        declared parameter on its own, at most once, so its top level's ``minProperties`` (which it
        does not hold) is left out of the check: no key of it can be written twice."""
        declared = self.parameters.get("type", "object")
        if declared != "object" and not (isinstance(declared, list) and "object" in declared):
            raise GrammarError(f"must be a JSON schema of type \"object\", not {json.dumps(declared)[:80]}")
        error = option_error(self.parameters)
        if error:
            raise GrammarError(error)
        options = {**client_options(self.parameters), "lenient": True}
        schema = self.object_parameters if one_value else {
            key: value for key, value in self.object_parameters.items() if key != "minProperties"}
        return GrammarRequest(GrammarKind.JSON_SCHEMA, json.dumps({**schema, OPTIONS_KEY: options}))

    def properties(self, forbidden: frozenset[str] = FORBIDDEN_IN_CAPTURE) -> list[tuple[str, Any, bool]]:
        """(name, schema, required) for each declared property the parsers can read, in order
        (`is_markup_name` under the syntax's key tag's ``forbidden`` characters)."""
        required = self._required()
        properties = tool_properties(self.document)
        return [(key, value, key in required) for key, value in properties.items() if is_markup_name(key, forbidden)]

    def unwritable_required(self, forbidden: frozenset[str] = FORBIDDEN_IN_CAPTURE) -> tuple[str, str, str] | None:
        """(name, why, request field) of the first required property a tag syntax cannot write,
        which a forced call would leave out: its name is no markup name (`properties`), or it is not
        declared (a tag grammar writes declared properties only). None when every one can be written."""
        properties = tool_properties(self.document)
        for key in self._required():
            if key not in properties:
                return key, "it is not declared in properties (calls write declared parameters only)", \
                    f"{self.param}.required"
            if not is_markup_name(key, forbidden):
                held = " or ".join("newline" if c == "\n" else repr(c) for c in sorted(forbidden, reverse=True))
                return key, (f"a parameter name in this model's tool-call syntax holds no {held}, no surrounding "
                             f"whitespace and at most {MAX_CAPTURE_LEN} characters"), f"{self.param}.properties.{key}"
        return None

    def unheld_combinator(self) -> str:
        """The first ``anyOf``, ``oneOf`` or ``allOf`` at the top level of the parameters schema (or
        of its top ``$ref``'s target), which a tag syntax cannot hold ("" when there is none): it
        writes each declared property on its own, so such a keyword was dropped and a forced call
        wrote arguments it refuses (``{}`` for ``anyOf`` of objects that each require a key). A JSON
        call or harmony grammar writes the arguments as one JSON value under the whole schema."""
        for node in (self.parameters, self.document.deref(self.parameters)):
            for key in ("anyOf", "oneOf", "allOf"):
                if isinstance(node, Mapping) and isinstance(node.get(key), list) and node[key]:
                    return key
        return ""

    def _required(self) -> tuple[str, ...]:
        """The ``required`` names, in order."""
        root = self.document.deref(self.parameters)
        required = root.get("required") if isinstance(root, Mapping) else None
        return tuple(dict.fromkeys(k for k in required if isinstance(k, str))) if isinstance(required, list) else ()


@dataclass(frozen=True)
class CallPolicy:
    """What the grammar allows besides reasoning: calls of ``tools`` (at most one when
    ``single_call``) and, by ``answer``, an answer instead of or before them."""

    tools: tuple[ToolSchema, ...]
    answer: AnswerKind
    single_call: bool = False

    @property
    def forces_one_tool(self) -> bool:
        """Whether the output must call the one tool (a named ``tool_choice``, or ``required`` with one tool)."""
        return self.answer is AnswerKind.NONE and len(self.tools) == 1

    def __post_init__(self) -> None:
        if not self.tools:
            raise ValueError("a call policy needs at least one callable tool")
        if not all(is_markup_name(tool.name) for tool in self.tools):
            raise ValueError("tool names must be readable as markup names")


class CallGrammar:
    """Invocation rules for one tag tool syntax inside one grammar build."""

    def __init__(self, rules: LarkRules, grammar: ToolGrammar, speller: Speller, json_options: Mapping,
                 forced: bool = False):
        """`forced`: the output must call the one tool (`CallPolicy.forces_one_tool`): a top-level
        combinator its parameters hold, which this syntax cannot, is then a 400; otherwise it is left
        out, as the model's own call of a tool it was not forced to call is."""
        self._forced = forced
        self._rules = rules
        self._g = grammar
        self._spell = speller
        cuts = tuple(tag.prefix for tag in grammar.value_end_tags().values())
        self._style = ValueStyle(grammar.value_format, grammar.value_wrap, grammar.string_flag, cuts)
        self._json_options = dict(json_options)
        self._values: dict[tuple, ValueGrammar] = {}  # by the JSON options of a tool's values
        self.ws = rules.terminal("ws", WHITESPACE)

    def opener(self) -> Spelling:
        return self._spell(self._g.block_open)

    def closer(self) -> str:
        return lark_of(self._spell(self._g.block_close))

    def invocations(self, tools: Sequence[ToolSchema]) -> str:
        """A rule choosing one invocation of one of ``tools`` (with its invocation closer, if any)."""
        return self._rules.rule("invoke", " | ".join(self.invocation(tool) for tool in tools))

    def invocation(self, tool: ToolSchema) -> str:
        g, spell = self._g, self._spell
        if g.invoke_open is not None:
            form = g.invoke_open
            head = join(spell(form.prefix), text_spelling(tool.name), spell(form.terminators[0]))
        else:  # the name is inline text right after the block opener, ended by the name separator
            head = join(text_spelling(tool.name), spell(g.name_separator))
        parts = [lark_of(head), *self._parameters(tool)]
        if g.invoke_close:
            parts.append(f"{self.ws}? {lark_of(spell(g.invoke_close))}")
        return self._rules.rule(f"call_{_slug(tool.name)}", " ".join(parts))

    def _parameters(self, tool: ToolSchema) -> list[str]:
        combinator = tool.unheld_combinator() if self._forced else ""
        if combinator:
            raise GrammarError(f"tool {tool.name!r} parameters: a top-level {combinator} cannot be held by this "
                               "model's tool-call syntax, which writes each declared parameter on its own; "
                               "declare the parameters in properties (and required) instead",
                               "tools" if tool.index is None else tool.param)
        forbidden = self._g.key_open.forbidden
        unwritable = tool.unwritable_required(forbidden)
        if unwritable is not None:
            key, why, where = unwritable
            raise GrammarError(f"tool {tool.name!r} parameter {key!r} is required but cannot be written: {why}",
                               "tools" if tool.index is None else where)
        out = []
        values = self._values_of(tool)
        for key, schema, required in tool.properties(forbidden):
            try:
                rule = self._parameter(values, key, schema, tool.document)
            except GrammarError as error:
                where = "tools" if tool.index is None else f"{tool.param}.properties.{key}"
                raise GrammarError(f"tool {tool.name!r} parameter {key!r}: {error}", where) from None
            out.append(rule if required else f"({rule})?")
        return out

    def _values_of(self, tool: ToolSchema) -> ValueGrammar:
        """The value grammar of `tool`'s parameters: their JSON values take the options its
        ``x-guidance`` may set (`grammar_options`, such as ``whitespace_flexible``) over the server's
        defaults, as a JSON-call syntax's arguments do (`grammar_json_calls.arguments_schema`);
        `ValueGrammar` keeps ``lenient`` on. Each JSON value is read by the parsers with JSON's own
        whitespace rules (`parsers.values.parse_json` of the stripped text), and JSON whitespace never
        spells a closer (every closer holds a non-space character), so flexible whitespace keeps
        every value one the parser reads back."""
        options = {**self._json_options, **client_options(tool.parameters)}
        key = tuple(sorted(options.items()))
        if key not in self._values:
            self._values[key] = ValueGrammar(self._rules, self._style, self._spell(self._g.value_close), options)
        return self._values[key]

    def _parameter(self, values: ValueGrammar, key: str, schema: Any, document: SchemaDocument) -> str:
        g, spell = self._g, self._spell
        value = values.value(schema, document)
        form = g.key_open
        pieces = [spell(form.prefix), text_spelling(key), spell(form.terminators[0])]
        if g.string_flag is not None:
            pieces += [text_spelling(value.flag), spell(form.terminators[1])]
        tag = lark_of(join(*pieces))
        opening = f" {self.ws}? {lark_of(spell(g.value_open))}" if g.value_open else ""
        return self._rules.rule("param", f"{self.ws}? {tag}{opening} {value.rule}")


def _slug(name: str) -> str:
    return "".join(c if c.isascii() and c.isalnum() else "_" for c in name)[:40]


@dataclass(frozen=True)
class TagEnvelope:
    """The prompt-dependent inputs of a tag-syntax tool grammar."""

    state: ReasoningState
    policy: CallPolicy


def tag_tool_lark(syntax: OutputSyntax, speller: Speller, envelope: TagEnvelope, json_options: Mapping) -> str:
    """The top-level Lark grammar (referencing ``@answer`` for a STRUCTURED answer)."""
    grammar = tool_grammar(syntax)
    if grammar is None:
        raise ValueError(f"{syntax.tool_kind.name} output has no tool-call syntax")
    rules = LarkRules()
    policy = envelope.policy
    calls = CallGrammar(rules, grammar, speller, json_options, forced=policy.forces_one_tool)
    after_open = _after_opener(rules, calls, policy, syntax.tool_kind in _ONE_CALL_PER_BLOCK)
    tail = rules.rule("calls_tail", f"{after_open} {calls.ws}?")
    think = syntax.think
    body = _body(rules, calls, grammar, speller, policy, tail, think, envelope.state)
    if think is None or envelope.state in (ReasoningState.CLOSED, ReasoningState.NO_REASONING):
        return rules.text(body)
    stops = [speller(think.close)]
    if think.terminal:
        stops.append(speller(think.terminal))
    escaped = syntax.reasoning_kind is ReasoningSyntaxKind.XTML_THINK
    upto = text_then(rules, stops, escaped=escaped)
    reasoned = f"{upto[0]} {body}" + (f" | {upto[1]} {tail}" if think.terminal else "")
    if envelope.state is ReasoningState.OPEN:
        return rules.text(reasoned)
    opened = rules.rule("reasoned", reasoned)
    return rules.text(f"{lark_of(speller(think.open))} {opened} | {body}")


def _after_opener(rules: LarkRules, calls: CallGrammar, policy: CallPolicy, one_per_block: bool) -> str:
    """Everything after the first block opener: the calls and the closers (more blocks if allowed)."""
    ws, invoke = calls.ws, calls.invocations(policy.tools)
    if one_per_block:
        block = rules.rule("block", f"{ws}? {invoke} {ws}? {calls.closer()}")
        if policy.single_call:
            return block
        return rules.rule("blocks", f"{block} ({ws}? {lark_of(calls.opener())} {block})*")
    more = "" if policy.single_call else f" ({ws}? {invoke})*"
    return rules.rule("block", f"{ws}? {invoke}{more} {ws}? {calls.closer()}")


def _body(rules: LarkRules, calls: CallGrammar, grammar: ToolGrammar, speller: Speller, policy: CallPolicy,
          tail: str, think: ThinkSyntax | None, state: ReasoningState) -> str:
    """What follows reasoning: calls, or the answer the policy allows."""
    opener = calls.opener()
    separator = think.after_close if think is not None else ""
    if policy.answer is AnswerKind.FREE:  # text (which may spell the gap), then calls or the end
        avoid = [speller(think.open)] if think is not None and state is ReasoningState.UNOPENED else []
        if grammar.bare_invocations:  # the parser reads one at a line start as a call, which no rule here would check
            return _free_body(rules, opener, avoid, grammar.invoke_open.prefix, tail)
        upto_open = text_then(rules, [opener], avoid=avoid)[0]
        return rules.rule("body", f"{upto_open} {tail} | {free_text(rules, [opener, *avoid])}?")
    gaps = sorted({text for text in (separator, grammar.block_lead) if text})
    gap = f"({' | '.join(lark_of(text_spelling(text)) for text in gaps)})? " if gaps else ""
    branches = [f"{gap}{lark_of(opener)} {tail}"]
    if policy.answer is AnswerKind.STRUCTURED:
        branches.append(f"{lark_of(text_spelling(separator))}? {ANSWER_RULE}" if separator else ANSWER_RULE)
    return rules.rule("body", " | ".join(branches))


def _free_body(rules: LarkRules, opener: Spelling, avoid: Sequence[Spelling], bare: str, tail: str) -> str:
    """Free answer text, then the calls or the end, where the parser reads a `bare` invocation tag
    (`ToolGrammar.bare_invocations`: Qwen Coder's ``<function=``) at the start of a line as a call
    (`tag_tools`): the text never spells `bare` at its start or right after a newline, nor the
    opener or `avoid`; mid-line it may (prose naming ``<function=x>`` is answer text to the parser
    too). `text_then` and `free_text`, with that line-start rule laid over the text."""
    line_start = f"~/(?:{ANY_TEXT}\\n)?{regex_escape(bare)}{ANY_TEXT}/"
    text_matching = [opener] if opener[0].is_token and opener[0].text_matches else []
    if opener[0].is_token:  # a greedy text that never spells the opener's token text, then the token
        text = rules.terminal("text", avoiding(f"/(?s:.+)/ & {line_start}", [*avoid, *text_matching]))
        upto_open = rules.rule("upto", f"{text}? {lark_of(opener)}")
    else:  # one lazy lexeme up to the opener's first occurrence
        others = [spelling for spelling in avoid if spelled_text(spelling) not in opener[0].text]
        upto = f"/{ANY_TEXT}{regex_escape(opener[0].text)}/ & {line_start}"
        lazy = rules.rule("lazy", avoiding(upto, others), "lazy")
        upto_open = rules.rule("upto", " ".join(filter(None, (lazy, lark_of(opener[1:])))))
    free = rules.terminal("text", avoiding(f"/(?s:.+)/ & {line_start}", [opener, *avoid]))
    return rules.rule("body", f"{upto_open} {tail} | {free}?")
