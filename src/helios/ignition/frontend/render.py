"""The Hugging Face chat-template dialect, for rendering probe conversations at preparation.

The same environment `transformers` uses for `apply_chat_template` (and the runtime's
`helios.frontend.preparation.template`, which ignition may not import): an immutable jinja2 sandbox with
trim_blocks, lstrip_blocks, loop controls, `tojson` (``ensure_ascii=False``), `raise_exception` and
`strftime_now`. Probe renders fix `strftime_now` to a constant date, so analysis is reproducible.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Mapping

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from helios.ignition.architecture import CheckpointError


PROBE_DATE = datetime(2024, 7, 26)


class TemplateRaised(Exception):
    """`raise_exception(...)` called by a template."""


def _raise_exception(message: str) -> None:
    raise TemplateRaised(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


# What a template can raise on a probe it does not support (a role, tool calls, a kwarg).
RENDER_FAILURES = (jinja2.TemplateError, TemplateRaised, TypeError, ValueError, KeyError, IndexError,
                   AttributeError)


class ProbeTemplate:
    """One compiled chat template plus its template tokens (bos_token, ...); immutable."""

    def __init__(self, source: str, template_tokens: Mapping[str, str]):
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
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
        return self._template.render(**variables)

    def try_render(self, messages: list[dict], **options: object) -> str | None:
        """The rendered text, or None when the template rejects the probe."""
        try:
            return self.render(messages, **options)
        except RENDER_FAILURES:
            return None
