"""Rank zero's step messages over the group, in one preallocated int64 buffer.

Every message is one broadcast of the same fixed-size tensor (`CHANNEL_WORDS` int64 words: the
message's length, then its words; `helios.runtime.parallel.rank_wire` encodes them). A message longer than
the buffer (a batch of long prompts admitted at once, many grammar masks) sends its remaining
words in a second broadcast sized by the first. Compared with a length broadcast followed by a
JSON byte broadcast this is one collective per step instead of two, and no allocation.

A message is at most `MAX_MESSAGE_WORDS` words: rank zero refuses to send a longer one (`WireError`:
that plan fails, nothing crossed, the group stays in step), and a peer checks the length word
before it allocates the spill buffer, so a broken length never allocates more than that.
"""

from __future__ import annotations

import torch

from helios.abi.collectives import RankGroup
from helios.runtime.parallel.rank_timing import PhaseTimers
from helios.runtime.parallel.rank_wire import StepMessage, WireDecoder, WireEncoder, WireError

CHANNEL_WORDS = 2048  # 16 KiB: a 64-row decode plan with fresh pages fits; admissions may spill
# 512 MiB of words: hundreds of context-long prompts admitted at once, with grammar masks, fit.
MAX_MESSAGE_WORDS = 1 << 26


class StepChannel:
    """Rank zero sends (`send`), every peer receives (`receive`) the same sequence of messages."""

    def __init__(self, group: RankGroup, timers: PhaseTimers, words: int = CHANNEL_WORDS,
                 max_words: int = MAX_MESSAGE_WORDS):
        self.group = group
        self._max_words = max_words
        self.timers = timers
        self._buffer = torch.zeros(words, dtype=torch.int64)
        self._encoder = WireEncoder()
        self._decoder = WireDecoder()

    def send(self, message: StepMessage) -> None:
        with self.timers.phase("encode"):
            words = self._encoder.encode(message, self._max_words)  # refused: no handle taken
            room = self._buffer.numel() - 1
            self._buffer[0] = len(words)
            head = words[:room]
            self._buffer[1:1 + len(head)] = torch.tensor(head, dtype=torch.int64)
        with self.timers.phase("send"):
            self.group.broadcast(self._buffer, 0)
            if len(words) > room:
                self.group.broadcast(torch.tensor(words[room:], dtype=torch.int64), 0)

    def receive(self) -> StepMessage:
        """Blocks until rank zero sends, at most the group's timeout (rank zero keeps it alive)."""
        with self.timers.phase("receive"):  # includes waiting for rank zero
            self.group.broadcast(self._buffer, 0)
            length, room = int(self._buffer[0]), self._buffer.numel() - 1
            if not 0 <= length <= self._max_words:  # before allocating anything for it
                raise WireError(f"message length {length} is outside 0..{self._max_words}")
            words = self._buffer[1:1 + min(length, room)].tolist()
            if length > room:
                rest = torch.empty(length - room, dtype=torch.int64)
                self.group.broadcast(rest, 0)
                words += rest.tolist()
        with self.timers.phase("decode"):
            return self._decoder.decode(words)
