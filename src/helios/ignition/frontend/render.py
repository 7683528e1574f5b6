"""The Hugging Face chat-template dialect, for rendering probe conversations at preparation.

The same environment `transformers` uses for `apply_chat_template` (and the runtime's
`helios.frontend.preparation.template`, which ignition may not import): an immutable jinja2 sandbox with
trim_blocks, lstrip_blocks, loop controls, `tojson` (``ensure_ascii=False``), `raise_exception` and
`strftime_now`. Probe renders fix `strftime_now` to a constant date, so analysis is reproducible.

The template is the checkpoint's, so untrusted: besides the sandbox's attribute rules, a render
stops (SecurityError, one of RENDER_FAILURES) when an operator would build a value past
`MAX_RENDER_CHARS` (``'x' * 10**10``) or an integer power past `MAX_POWER_BITS` (``10 ** 10 ** 10``),
or when the rendered text grows past `MAX_RENDER_CHARS`; arithmetic errors and runaway recursion are
render failures too. (Loops that render nothing are bounded only by the sandbox's range limit.)
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Mapping

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from helios.ignition.architecture import CheckpointError


PROBE_DATE = datetime(2024, 7, 26)
MAX_RENDER_CHARS = 1 << 22  # probe conversations render to a few kilobytes
MAX_POWER_BITS = 1 << 16


class TemplateRaised(Exception):
    """`raise_exception(...)` called by a template."""


def _raise_exception(message: str) -> None:
    raise TemplateRaised(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


# What a template can raise on a probe it does not support (a role, tool calls, a kwarg), or on
# arithmetic, recursion or a size it may not reach.
RENDER_FAILURES = (jinja2.TemplateError, TemplateRaised, TypeError, ValueError, KeyError, IndexError,
                   AttributeError, ArithmeticError, RecursionError)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _sized(value: Any) -> int:
    return len(value) if isinstance(value, (str, list, tuple)) else 0


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """The sandbox with `+`, `*` and `**` checked before they build a value past the limits."""

    intercepted_binops = frozenset(("+", "*", "**"))

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        if operator == "**" and _is_int(left) and _is_int(right) and abs(left) > 1:
            if right * abs(left).bit_length() > MAX_POWER_BITS:
                raise SecurityError(f"the power {left} ** {right} is too large")
        elif operator == "*":
            size = max(_sized(left) * right if _is_int(right) else 0, _sized(right) * left if _is_int(left) else 0)
            if size > MAX_RENDER_CHARS:
                raise SecurityError(f"a repetition of {size} items is too large")
        elif operator == "+" and _sized(left) + _sized(right) > MAX_RENDER_CHARS:
            raise SecurityError("a concatenation is too large")
        return super().call_binop(context, operator, left, right)


class ProbeTemplate:
    """One compiled chat template plus its template tokens (bos_token, ...); immutable."""

    def __init__(self, source: str, template_tokens: Mapping[str, str]):
        env = _BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda format: PROBE_DATE.strftime(format)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as error:
            raise CheckpointError(f"the chat template does not compile: {error}") from None
        self._tokens = dict(template_tokens)

    def render(self, messages: list[dict], *, tools: list[dict] | None = None,
               add_generation_prompt: bool = False, **kwargs: object) -> str:
        """The rendered text; raises one of RENDER_FAILURES when the template rejects the probe."""
        variables = {**kwargs, **self._tokens, "messages": messages, "tools": tools,
                     "add_generation_prompt": add_generation_prompt}
        chunks, size = [], 0
        for chunk in self._template.generate(**variables):
            size += len(chunk)
            if size > MAX_RENDER_CHARS:
                raise SecurityError(f"the rendered text exceeds {MAX_RENDER_CHARS} characters")
            chunks.append(chunk)
        return "".join(chunks)

    def try_render(self, messages: list[dict], **options: object) -> str | None:
        """The rendered text, or None when the template rejects the probe."""
        try:
            return self.render(messages, **options)
        except RENDER_FAILURES:
            return None
