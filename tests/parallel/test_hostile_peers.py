"""The rank plane against broken or hostile peers and operator mistakes: a length word that would
allocate without bound, raw sockets at the rendezvous, a rank claimed twice, records of another
version, and `helios rank` given bad options or stopped while it joins. Each ends in a typed
error (one line and a documented exit code for the command), never a hang, a crash or a traceback."""

from __future__ import annotations

import pytest
import torch

from helios.runtime.parallel.rank_channel import StepChannel
from helios.runtime.parallel.rank_timing import PhaseTimers
from helios.runtime.parallel.rank_wire import MessageKind, StepMessage, WireDecoder, WireError
from helios.runtime.records.capacities import Operation
from helios.runtime.records.plan import StepPlan
from helios.runtime.records.request import RequestSpec


class _Broadcasts:
    """A stand-in group: `broadcast` writes the given length word and records what was asked."""

    def __init__(self, length: int):
        self.length = length
        self.shapes: list[tuple[int, ...]] = []

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        self.shapes.append(tuple(tensor.shape))
        if len(self.shapes) == 1:
            tensor[0] = self.length


@pytest.mark.parametrize("length", [2**62, 2**40, -5])
def test_a_broken_length_word_allocates_nothing(length):
    """A peer reads the length word before it sizes the spill buffer: a broken one is a WireError,
    and no second broadcast (and no allocation of `length` words) happens."""
    group = _Broadcasts(length)
    with pytest.raises(WireError, match="message length"):
        StepChannel(group, PhaseTimers()).receive()
    assert group.shapes == [(2048,)]


def _admitting(request_id: str, prompt_tokens: int) -> StepMessage:
    plan = StepPlan(1, 0, Operation.DECODE, None, (), (), 0,
                    (RequestSpec(request_id, tuple(range(prompt_tokens)), 4, frozenset()),))
    return StepMessage(MessageKind.STEP, plan)


def test_a_message_past_the_channel_limit_is_refused_before_it_crosses():
    """Rank zero refuses to send it (that plan fails) and takes no handle for its admissions, so
    its next message still decodes on a peer."""
    group = _Broadcasts(0)
    channel = StepChannel(group, PhaseTimers(), words=16, max_words=64)
    with pytest.raises(WireError, match="longer than the channel"):
        channel.send(_admitting("long", 100))
    assert group.shapes == []
    words = channel._encoder.encode(_admitting("short", 3))
    assert WireDecoder().decode(words).plan.admitted[0].request_id == "short"
