"""Chat templates: untrusted core data compiled and rendered in an immutable jinja2 sandbox.

The environment matches the Hugging Face chat-template dialect (trim_blocks, lstrip_blocks, loop
controls, `tojson` with ``ensure_ascii=False``, `raise_exception`, `strftime_now`) inside
`ImmutableSandboxedEnvironment`: templates cannot reach Python internals or mutate their inputs.
A template that fails to compile is a `TemplateLoadError` at startup; a render that fails on a
request's data (including the template's own `raise_exception`) is a `TemplateRenderError` (HTTP 400).

A compiled `ChatTemplate` is immutable and safe to render from several threads.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Mapping

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from helios.errors import LoadError, RequestError

# Template variables the prompt path supplies itself; request kwargs may not override them.
RESERVED_NAMES = frozenset({"messages", "tools", "add_generation_prompt", "raise_exception", "strftime_now"})
TEMPLATE_KWARG_TYPES = (bool, int, float, str, type(None))


class TemplateLoadError(LoadError):
    """The core's chat template does not compile."""


class TemplateRenderError(RequestError):
    """Rendering the chat template failed for this request's messages, tools or arguments."""


class _TemplateRaised(Exception):
    """`raise_exception(...)` called by a template."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


# Failures a template can cause while rendering request data; anything else is a bug and propagates.
_RENDER_FAILURES = (
    jinja2.TemplateError,
    _TemplateRaised,
    TypeError,
    ValueError,
    KeyError,
    IndexError,
    AttributeError,
    ZeroDivisionError,
    OverflowError,
    RecursionError,
)


class ChatTemplate:
    """One compiled chat template plus the template tokens (bos_token, ...) the contract declares."""

    def __init__(self, source: str, template_tokens: Mapping[str, str] | None = None):
        tokens = dict(template_tokens or {})
        clash = RESERVED_NAMES & tokens.keys()
        if clash:
            raise TemplateLoadError(f"template token names clash with reserved variables: {sorted(clash)}")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as error:
            raise TemplateLoadError(f"chat template does not compile: {error}") from None
        self._tokens = tokens

    @property
    def template_token_names(self) -> frozenset[str]:
        return frozenset(self._tokens)

    def render(
        self,
        messages: list[dict],
        *,
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        template_kwargs: Mapping[str, object] | None = None,
    ) -> str:
        """Renders the prompt text. `messages`/`tools` are fresh plain structures (see messages.py)."""
        kwargs = check_template_kwargs(template_kwargs, self.template_token_names)
        variables = {
            **kwargs,
            **self._tokens,
            "messages": messages,
            "tools": tools,
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            return self._template.render(**variables)
        except _RENDER_FAILURES as error:
            raise TemplateRenderError(f"chat template failed: {type(error).__name__}: {error}") from None


def check_template_kwargs(template_kwargs: Mapping[str, object] | None, token_names: frozenset[str]) -> dict:
    """Extra template arguments (for example enable_thinking): identifiers mapped to JSON scalars."""
    if template_kwargs is None:
        return {}
    if not isinstance(template_kwargs, Mapping):
        raise TemplateRenderError("chat_template_kwargs must be an object")
    for name, value in template_kwargs.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise TemplateRenderError(f"chat_template_kwargs: {name!r} is not an identifier")
        if name in RESERVED_NAMES or name in token_names:
            raise TemplateRenderError(f"chat_template_kwargs may not set {name!r}")
        if not isinstance(value, TEMPLATE_KWARG_TYPES):
            raise TemplateRenderError(f"chat_template_kwargs.{name} must be a boolean, number, string or null")
    return dict(template_kwargs)
