"""SSE encoding of stream chunks: one JSON encoder for every chunk, and byte templates for the
chunks a stream repeats once per token.

`encode_json` is the encoder of every chunk and body (compact separators, UTF-8 text not escaped),
built once instead of once per call. `ChunkTemplate` renders the per-token chunks of one stream
(after its first chunk: no ``prompt_token_ids``) from pre-rendered bytes: the constant head
(``id``, ``object``, ``created``, ``model``), the plain choice's constant fields and the tail (with
``"usage":null`` when the stream includes usage); only the token id, its timestamp and the text or
delta are encoded per chunk; `ChunkTemplate.step` renders one plain step's chunks (its id chunk and
its text or content chunk) in one formatting operation. The bytes are exactly what encoding the
chunk dict gives (the presenter's `_chunk` and `_choice` key order): tests compare the two for
every chunk shape.
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring
from typing import Sequence

encode_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def sse_data(data: dict) -> bytes:
    return b"data: " + encode_json(data).encode() + b"\n\n"


def _integers(values: Sequence[int]) -> bytes:
    return b",".join([b"%d" % v for v in values])


def _string(text: str) -> bytes:
    return encode_basestring(text).encode()


class ChunkTemplate:
    """Per-token SSE chunks of one stream, with one choice at index 0 and no logprobs."""

    def __init__(self, response_id: str, object_name: str, created: int, model: str, *, is_chat: bool,
                 include_usage: bool):
        self._is_chat = is_chat
        head = (b'data: {"id":' + _string(response_id) + b',"object":' + _string(object_name)
                + b',"created":' + encode_json(created).encode() + b',"model":' + _string(model))
        self._open = head + (b',"choices":[{"index":0,"delta":' if is_chat else b',"choices":[{"index":0,"text":')
        self._close = b',"logprobs":null,"finish_reason":null'
        self._tail = b'}],"usage":null}\n\n' if include_usage else b'}]}\n\n'
        self._empty = b"{}" if is_chat else b'""'
        self._ids_open = self._open + self._empty + self._close + b',"token_ids":['
        self._text_close = self._close + self._tail
        self._content_open = self._open + b'{"content":'
        self._content_close = b"}" + self._text_close

    def step(self, token_id: int | None, timestamp_ns: int | None, text: str) -> bytes:
        """The chunks of one plain step: its metadata chunk (`token_id` None: none) and, when
        `text` is not empty, its text chunk (chat: a ``content`` delta). The same bytes as
        `observation` followed by `text` or `delta`, in one formatting operation."""
        if token_id is None:
            ids = b""
        elif timestamp_ns is None:
            ids = b'%s%d]%s' % (self._ids_open, token_id, self._tail)
        else:
            ids = b'%s%d],"token_timestamps_ns":[%d]%s' % (self._ids_open, token_id, timestamp_ns, self._tail)
        if not text:
            return ids
        if self._is_chat:
            return b"%s%s%s%s" % (ids, self._content_open, _string(text), self._content_close)
        return b"%s%s%s%s" % (ids, self._open, _string(text), self._text_close)

    def observation(self, token_id: int, timestamp_ns: int | None) -> bytes:
        """The metadata-only chunk of one generated id."""
        return self.observations((token_id,), None if timestamp_ns is None else (timestamp_ns,))

    def observations(self, token_ids: Sequence[int], timestamps_ns: Sequence[int] | None) -> bytes:
        """The metadata-only chunk of consecutive generated ids (a step run's)."""
        ids = b'%s%s%s,"token_ids":[%s]' % (self._open, self._empty, self._close, _integers(token_ids))
        if timestamps_ns is not None:
            ids += b',"token_timestamps_ns":[%s]' % _integers(timestamps_ns)
        return ids + self._tail

    def text(self, text: str) -> bytes:
        """A text completion chunk."""
        return self._open + _string(text) + self._close + self._tail

    def delta(self, delta: dict) -> bytes:
        """A chat chunk with `delta`; a single text field is rendered without the dict encoder."""
        if len(delta) == 1:
            key, value = next(iter(delta.items()))
            if key in ("content", "reasoning_content"):
                body = (b'{"content":' if key == "content" else b'{"reasoning_content":') + _string(value) + b"}"
                return self._open + body + self._close + self._tail
        return self._open + encode_json(delta).encode() + self._close + self._tail
