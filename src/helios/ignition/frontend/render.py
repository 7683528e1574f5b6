"""The Hugging Face chat-template dialect, for rendering probe conversations at preparation.

The same environment `transformers` uses for `apply_chat_template` (and the runtime's
`helios.frontend.preparation.template`, which ignition may not import): an immutable jinja2 sandbox with
trim_blocks, lstrip_blocks, loop controls, `generation` blocks, `tojson` (``ensure_ascii=False``),
`raise_exception` and `strftime_now`. Probe renders fix `strftime_now` to a constant date, so analysis is reproducible.

The template is the checkpoint's, so untrusted: it renders in `helios.core.template_sandbox`'s
bounded sandbox (the one the runtime serves it in), with `PROBE_BOUNDS`: probe conversations render
to a few kilobytes, so a render past `PROBE_BOUNDS.max_chars` characters, or past the CPU time a
render gets at serving time, is a template that would run away at serving time too. Such a render
raises `RenderLimitExceeded` (one of RENDER_FAILURES, so a required probe names itself in the
`CheckpointError`), and `try_render` does not take it for a rejected probe: it stops prepare with a
`CheckpointError` naming the template. Arithmetic errors and runaway recursion are render failures.
"""

from __future__ import annotations

from datetime import datetime
from typing import Mapping

import jinja2

from helios.core.template_sandbox import (
    BoundedSandbox, RenderBounds, RenderLimitExceeded, TemplateRaised, bounded_strftime, render_bounded)
from helios.ignition.architecture import CheckpointError


PROBE_DATE = datetime(2024, 7, 26)
# The CPU time matches the frontend's serving bound (which ignition may not import): a template
# that cannot render a probe within it could not render a request either.
PROBE_BOUNDS = RenderBounds(max_chars=1 << 22, cpu_seconds=2.0)


# What a template can raise on a probe it does not support (a role, tool calls, a kwarg), or on
# arithmetic, recursion or a size it may not reach; and what jinja's own pieces raise on a template's
# mistake, which escaped prepare as a traceback: a lookup of an unknown codec (``'x'.encode('no')``,
# a LookupError), ``truncate`` shorter than its ellipsis (an AssertionError), ``cycler()`` without
# items (a RuntimeError, RecursionError's base) and a float literal past the float range (``1e400|int``,
# compiled to the undefined name ``inf``: a NameError).
RENDER_FAILURES = (jinja2.TemplateError, TemplateRaised, TypeError, ValueError, LookupError, AttributeError,
                   ArithmeticError, RuntimeError, AssertionError, NameError)


class ProbeTemplate:
    """One compiled chat template plus its template tokens (bos_token, ...); immutable."""

    def __init__(self, source: str, template_tokens: Mapping[str, str]):
        env = BoundedSandbox()
        env.globals["strftime_now"] = lambda format: bounded_strftime(PROBE_DATE, format)
        try:
            self._template = env.from_string(source)
        # Jinja's parser and code generator recurse per nested expression or block, and Python's compiler
        # refuses the code of 100 nested loops: a RecursionError or SyntaxError, not a TemplateError.
        except (jinja2.TemplateError, RecursionError, SyntaxError) as error:
            raise CheckpointError(f"the chat template does not compile: {type(error).__name__}: {error}") from None
        self._tokens = dict(template_tokens)

    def render(self, messages: list[dict], *, tools: list[dict] | None = None,
               add_generation_prompt: bool = False, **kwargs: object) -> str:
        """The rendered text; raises one of RENDER_FAILURES when the template rejects the probe."""
        variables = {**kwargs, **self._tokens, "messages": messages, "tools": tools,
                     "add_generation_prompt": add_generation_prompt}
        return render_bounded(self._template, variables, PROBE_BOUNDS)

    def try_render(self, messages: list[dict], **options: object) -> str | None:
        """The rendered text, or None when the template rejects the probe; CheckpointError at a bound."""
        try:
            return self.render(messages, **options)
        except RenderLimitExceeded as error:
            raise CheckpointError(f"the chat template runs away on a probe conversation: {error}") from None
        except RENDER_FAILURES:
            return None
