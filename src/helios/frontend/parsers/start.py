"""Where an output begins and how its answer is constrained: per-request parser inputs.

The shared prompt path decides these from the rendered prompt (the open assistant envelope); the
request decides `AnswerMode`. All are immutable values.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from helios.frontend.decoding.syntax import ThinkSyntax

# The prompt path's verdict on the open assistant envelope (see `helios.frontend.preparation.prompt`), used by
# the delimiter syntaxes: OPEN -> output starts inside reasoning; UNOPENED -> output may open
# reasoning once, before any answer text; CLOSED -> reasoning ended in the prompt, so reasoning
# delimiter tokens in the output are protocol markup; NO_REASONING is read like UNOPENED.
from helios.frontend.preparation.prompt import ReasoningState


class FramePosition(enum.Enum):
    """Where generation starts in recipient-header syntax."""

    BOUNDARY = "boundary"  # before a header: the output starts with the start control
    HEADER = "header"  # inside an open header (``<|start|>assistant``): the output adds the recipient
    BODY = "body"  # inside a frame body addressed to ``FrameStart.recipient``


@dataclass(frozen=True)
class FrameStart:
    """Initial recipient-frame position. ``header_text`` is the header text already rendered after
    the start control (HEADER); ``recipient`` the recipient of an initially open body (BODY)."""

    position: FramePosition = FramePosition.BOUNDARY
    header_text: str = ""
    recipient: str = ""

    def __post_init__(self) -> None:
        if (self.position is FramePosition.BODY) != bool(self.recipient):
            raise ValueError("a recipient is given exactly for an initially open body")
        if self.header_text and self.position is not FramePosition.HEADER:
            raise ValueError("header text is given only for an initially open header")


class AnswerMode(enum.Enum):
    """FREE: tool markup anywhere in the answer is parsed. STRUCTURED: the answer is an opaque
    grammar-constrained document; once its first non-whitespace character is out (and is not the
    tool opener), everything after it is answer text, literal tags included."""

    FREE = "free"
    STRUCTURED = "structured"


@dataclass(frozen=True)
class OutputStart:
    """Initial parser state from the prompt path. Delimiter syntaxes read ``reasoning``; the
    recipient-header parser reads ``frame``."""

    reasoning: ReasoningState = ReasoningState.UNOPENED
    frame: FrameStart = FrameStart()
    answer_lead: str = ""  # CLOSED: wrapping after the close delimiter that the prompt has not written


def pending_answer_lead(envelope_text: str, think: ThinkSyntax | None, control_text: str | None = None) -> str:
    """The part of ``think.after_close`` that a prompt which closed reasoning has not written: a
    generation prompt ending ``</think>`` leaves the model to write the ``\\n`` after it (GLM), one
    ending ``</think>\\n\\n`` leaves nothing (Qwen3). `envelope_text` is the open assistant envelope;
    `control_text` the same envelope with client markers escaped (`Prompt.control_text`), where the
    close delimiter is looked for: a client's literal ``</think>`` in a prefilled answer closes nothing."""
    if think is None or not think.after_close:
        return ""
    at = (envelope_text if control_text is None else control_text).rfind(think.close)
    if at < 0:
        return ""
    written = envelope_text[at + len(think.close) :]
    return think.after_close[len(written) :] if think.after_close.startswith(written) else ""
