"""The engine's message boundary: what the model worker emits and the commands it consumes.

The worker emits one `StepBatch` per round (after a plan completes, and after the admissions and
commands it applied): the round's token, prompt-score and finish events of every request, in order,
as plain records. A sink (`EventSink`, see `Engine.connect`) takes the batch and must not block: the
server's output workers (`helios.frontend.output_workers`) queue it and do detokenizing, stop
matching, parsing and presentation on their own threads while the worker packs the next step.

Commands flow the other way, as records the worker applies before it plans again: admission
(`Engine.submit`), `Cancel` (client gone, output failure) and `StopMatched` (the frontend found a stop
string in a request's text: the request ends with STOP, counting `num_output_tokens` output tokens,
the one that crossed the stop included; tokens the worker generated past it are dropped).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Union

from helios.runtime.events import RequestEvent


@dataclass(frozen=True)
class StepBatch:
    """The events one worker round produced, in emission order (each request's in its own order)."""

    events: tuple[RequestEvent, ...]


EventSink = Callable[[StepBatch], None]


class Cancel(NamedTuple):
    request_id: str


class StopMatched(NamedTuple):
    request_id: str
    num_output_tokens: int  # output tokens up to and including the one whose text completed the stop


Command = Union[Cancel, StopMatched]
