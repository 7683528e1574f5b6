"""Chat templates: untrusted core data compiled and rendered in the bounded jinja2 sandbox.

The environment (`helios.core.template_sandbox`, shared with prepare's probe renders) matches the
Hugging Face chat-template dialect (trim_blocks, lstrip_blocks, loop controls, `generation` blocks,
`tojson` with ``ensure_ascii=False``, `raise_exception`, `strftime_now`) inside `ImmutableSandboxedEnvironment`:
templates cannot reach Python internals or mutate their inputs, and one render may build no string,
list or text past `SERVING_BOUNDS.max_chars` and use no more than `SERVING_BOUNDS.cpu_seconds` of its
thread's CPU time. A template that fails to compile is a `TemplateLoadError` at startup; a render
that fails on a request's data (including the template's own `raise_exception`) is a
`TemplateRenderError` (HTTP 400); a render that reaches a bound is a `TemplateLimitError` (HTTP 500:
within the request size the server admits a correct template never gets near the bounds, so the
core's template is at fault, and the render has stopped, its thread free, when the error is raised).

Content sent as an array of text parts reaches a template as `apply_chat_template` passes it, a
list of parts, for the roles whose parts the template renders as text itself (`content_part_roles`:
Qwen2.5-VL's, GLM-4.5's and the embedded model's templates join the texts with nothing between);
for the others the texts are joined with newlines (vLLM's "string" content format), where
transformers' render raises on the list (Qwen3's, DeepSeek's, Mistral's, gpt-oss's) or prints its
Python repr (Llama 3.1's).

A compiled `ChatTemplate` is immutable and safe to render from several threads.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import cached_property
from typing import Mapping

import jinja2
from jinja2.defaults import DEFAULT_NAMESPACE

from helios.core.template_sandbox import (
    BoundedSandbox, RenderBounds, RenderLimitExceeded, TemplateRaised, bounded_strftime, render_bounded)
from helios.errors import LoadError, RequestError
from helios.frontend.preparation.messages import ToolArguments

# Template variables the prompt path supplies itself, jinja2's own globals (`namespace`, `range`, ...)
# and ``self`` (a template's blocks); request kwargs may not override them (a template calling
# `namespace()` failed with "'int' object is not callable", named as the conversation's fault).
RESERVED_NAMES = frozenset({"messages", "tools", "add_generation_prompt", "continue_final_message",
                            "raise_exception", "strftime_now", "self", *DEFAULT_NAMESPACE})
TEMPLATE_KWARG_TYPES = (bool, int, float, str, type(None))
# What one render may build and spend. A request is at most MAX_MESSAGES (1024) messages in a body of
# a few MiB (4 MiB by default), and a correct template renders each message a small number of
# times: the packaged family templates render a 4 MiB, 1024-message conversation into about 4 Mi
# characters in at most a few tens of ms of CPU (tests/frontend/test_template_bounds.py checks
# a tenth of each bound). The text cap is also more than the text of any context extent in use
# (a 1 M-token prompt is about 4 Mi characters); the CPU bound stops a runaway render within a few
# seconds, so it frees its preparation slot soon after its request's 10 s preparation timeout.
SERVING_BOUNDS = RenderBounds(max_chars=1 << 26, cpu_seconds=2.0)
# The probe conversations of `content_part_roles` render to a few hundred characters.
PROBE_BOUNDS = RenderBounds(max_chars=1 << 20, cpu_seconds=0.5)
PART_ROLES = ("system", "developer", "user", "assistant", "tool")
# Appended to the final message's text for `continue_final_message`, and the rendering cut where it
# appears: transformers' own tag (`render_jinja_template`), so a template that trims or rewrites the
# message's end is cut exactly where transformers cuts it.
CONTINUATION_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class TemplateLoadError(LoadError):
    """The core's chat template does not compile."""


class TemplateRenderError(RequestError):
    """Rendering the chat template failed for this request's messages, tools or arguments; `param`
    is ``messages`` (what a template refuses, with `raise_exception`, is the conversation) or
    ``chat_template_kwargs`` for arguments no template may receive."""

    param = "messages"


class ContinuationError(TemplateRenderError):
    """``continue_final_message`` cannot continue this conversation's final message: it has no text,
    or the template does not render its text verbatim at the end of the prompt. HTTP 400."""


class TemplateLimitError(LoadError):
    """The core's chat template reached a render bound (size or CPU time) on this request. HTTP 500."""


def _strftime_now(format: str) -> str:
    return bounded_strftime(datetime.now(), format)


# Failures a template can cause while rendering request data; anything else is a bug and propagates.
# Besides Python's own, what jinja's pieces raise on a template's mistake (as the reference's render
# raises them, a 400 like any conversation the template refuses, not a 500): an unknown codec
# (LookupError), ``truncate`` shorter than its ellipsis (AssertionError), ``cycler()`` without items
# (RuntimeError, RecursionError's base), a float literal past the float range (``1e400|int`` compiles
# to the undefined name ``inf``: NameError).
_RENDER_FAILURES = (
    jinja2.TemplateError,
    TemplateRaised,
    TypeError,
    ValueError,
    LookupError,
    AttributeError,
    ArithmeticError,
    RuntimeError,
    AssertionError,
    NameError,
)


class ChatTemplate:
    """One compiled chat template plus the template tokens (bos_token, ...) the contract declares."""

    def __init__(self, source: str, template_tokens: Mapping[str, str] | None = None,
                 bounds: RenderBounds = SERVING_BOUNDS):
        tokens = dict(template_tokens or {})
        clash = RESERVED_NAMES & tokens.keys()
        if clash:
            raise TemplateLoadError(f"template token names clash with reserved variables: {sorted(clash)}")
        env = BoundedSandbox()
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        # Jinja's parser and code generator recurse per nested expression or block, and Python's compiler
        # refuses the code of 100 nested loops: a RecursionError or SyntaxError, not a TemplateError.
        except (jinja2.TemplateError, RecursionError, SyntaxError) as error:
            raise TemplateLoadError(f"chat template does not compile: {type(error).__name__}: {error}") from None
        self._tokens = tokens
        self._bounds = bounds
        self._source = source

    @property
    def template_token_names(self) -> frozenset[str]:
        return frozenset(self._tokens)

    @cached_property
    def content_part_roles(self) -> frozenset[str]:
        """The roles whose text parts this template renders as text: a probe conversation with that
        role's contents as two text parts renders exactly as with each as one string, the two texts
        joined by what the template put between them (nothing for the shipped templates; a Python
        repr, or a part rendered as a message of its own, is no such joint). Computed on first use
        (a deterministic value: two threads may both compute it); a probe the template refuses, or
        that reaches a bound, leaves its role out."""
        roles = set()
        for role in PART_ROLES:
            try:
                as_parts = self._probe(role, None)
                first, second = _probe_texts(role)
                at = as_parts.find(first)
                joint = as_parts[at + len(first):as_parts.find(second, at)] if at >= 0 else ""
                if self._probe(role, joint) == as_parts:
                    roles.add(role)
            except (RenderLimitExceeded, *_RENDER_FAILURES):
                pass
        return frozenset(roles)

    def _probe(self, role: str, joint: str | None) -> str:
        """A conversation of every role (developer in place of system when `role` is developer), each
        content two texts; `role`'s as two text parts when `joint` is None, else as one string (the
        texts joined by `joint`), the others' as one string."""
        call = {"id": "call_probe", "type": "function", "function": {"name": "probe_tool",
                                                                  "arguments": ToolArguments('{"key": "value"}')}}
        roles = ("developer" if role == "developer" else "system", "user", "assistant", "tool", "assistant", "user")
        messages = []
        for i, name in enumerate(roles):
            texts = (f"Probe text {i}a.", f"Probe text {i}b.")
            if name != role:
                content = "".join(texts)
            else:
                content = [{"type": "text", "text": t} for t in texts] if joint is None else joint.join(texts)
            messages.append({"role": name, "content": content})
        messages[2]["tool_calls"] = [call]
        messages[3]["tool_call_id"] = call["id"]
        return render_bounded(self._template, {**self._tokens, "messages": messages, "tools": None,
                                               "add_generation_prompt": True}, PROBE_BOUNDS)

    def render(
        self,
        messages: list[dict],
        *,
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        template_kwargs: Mapping[str, object] | None = None,
        continue_final_message: bool = False,
    ) -> str:
        """Renders the prompt text. `messages`/`tools` are fresh plain structures (see messages.py).

        With `continue_final_message` the text ends right after the final message's text, so the model
        continues that message, as transformers' ``apply_chat_template(..., continue_final_message=True)``
        cuts it: the last text is tagged (`CONTINUATION_TAG`), and the rendering cut at the tag's last
        occurrence (and stripped of trailing whitespace where the template trimmed the tag's space).
        A final message without text, or one the template does not render verbatim, is a
        `ContinuationError`. The caller renders without `add_generation_prompt` (transformers refuses
        both) and may keep `messages`: the tag goes on a copy of the final message."""
        if continue_final_message:
            _check_untagged(messages, tools, template_kwargs)
            messages, final_text = self._tagged(messages)
        rendered = self._render(messages, tools, add_generation_prompt, template_kwargs)
        if not continue_final_message:
            return rendered
        tag = CONTINUATION_TAG.strip()
        if final_text.strip() not in rendered or tag not in rendered:
            raise ContinuationError(
                "continue_final_message: the chat template does not render the final message's text verbatim, so "
                "the prompt cannot end inside it (the template rewrites or drops part of it)")
        at = rendered.rindex(tag)
        if rendered[at:at + len(CONTINUATION_TAG)] == CONTINUATION_TAG:
            return rendered[:at]
        return rendered[:at].rstrip()  # the template trimmed the tag's space: the text's own trailing space too

    def _tagged(self, messages: list[dict]) -> tuple[list[dict], str]:
        """`messages` with `CONTINUATION_TAG` after the final message's last text (a copy of that
        message), and that text; as transformers tags it, and refuses what it refuses."""
        final = messages[-1] if messages else {}
        content = final.get("content")
        if content is None:
            raise ContinuationError("continue_final_message: the final message has no content to continue")
        if "content" not in self._source:
            raise ContinuationError("continue_final_message: this model's chat template renders no message content")
        if isinstance(content, list):
            last = next((i for i in reversed(range(len(content))) if "text" in content[i]), None)
            if last is None:
                raise ContinuationError("continue_final_message: the final message has no text to continue")
            text = content[last]["text"]
            content = [*content[:last], {**content[last], "text": text + CONTINUATION_TAG}, *content[last + 1:]]
        else:
            text, content = content, content + CONTINUATION_TAG
        return [*messages[:-1], {**final, "content": content}], text

    def _render(self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool,
                template_kwargs: Mapping[str, object] | None) -> str:
        kwargs = check_template_kwargs(template_kwargs, self.template_token_names)
        variables = {
            **kwargs,
            **self._tokens,
            "messages": messages,
            "tools": tools,
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            return render_bounded(self._template, variables, self._bounds)
        except RenderLimitExceeded as error:
            raise TemplateLimitError(f"the core's chat template exceeded a render bound: {error}") from None
        except _RENDER_FAILURES as error:
            raise TemplateRenderError(f"chat template failed: {type(error).__name__}: {error}") from None


def _check_untagged(messages: list[dict], tools: list[dict] | None, template_kwargs: Mapping[str, object] | None) -> None:
    """`ContinuationError` where request text holds the continuation tag: rendered after the final
    message (a tool or argument the template prints last), it would move the cut there, a prompt
    ending in the middle of other text (transformers cuts there silently)."""
    text = json.dumps([messages, tools, dict(template_kwargs or {})], ensure_ascii=False, default=str)
    if CONTINUATION_TAG.strip() in text:
        raise ContinuationError(f"continue_final_message: the request's text holds {CONTINUATION_TAG.strip()!r}, the "
                                "mark that finds the end of the final message in the rendered prompt")


def _probe_texts(role: str) -> tuple[str, str]:
    """The two texts of `role`'s first message in `ChatTemplate._probe`'s conversation."""
    index = {"system": 0, "developer": 0, "user": 1, "assistant": 2, "tool": 3}[role]
    return f"Probe text {index}a.", f"Probe text {index}b."


def check_template_kwargs(template_kwargs: Mapping[str, object] | None, token_names: frozenset[str]) -> dict:
    """Extra template arguments (for example enable_thinking): identifiers mapped to JSON scalars."""
    if template_kwargs is None:
        return {}
    if not isinstance(template_kwargs, Mapping):
        raise TemplateRenderError("chat_template_kwargs must be an object", "chat_template_kwargs")
    for name, value in template_kwargs.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise TemplateRenderError(f"chat_template_kwargs: {name!r} is not an identifier", "chat_template_kwargs")
        if name in RESERVED_NAMES or name in token_names:
            raise TemplateRenderError(f"chat_template_kwargs may not set {name!r}", "chat_template_kwargs")
        if not isinstance(value, TEMPLATE_KWARG_TYPES):
            raise TemplateRenderError(
                f"chat_template_kwargs.{name} must be a boolean, number, string or null", "chat_template_kwargs")
    return dict(template_kwargs)
