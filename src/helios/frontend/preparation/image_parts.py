"""OpenAI ``image_url`` content parts of chat messages.

A user message's content may mix text parts and ``{"type": "image_url", "image_url": {"url": ...,
"detail": ...}}`` parts. The message keeps its parts in order (`parts`: ("text", text) or ("image",
url)); the chat template receives them as Hugging Face content parts (``{"type": "text", "text"}``
and ``{"type": "image"}``, never the URL), so it renders each image's placeholder exactly as the
family's template does. `image_urls` lists a conversation's image URLs in prompt order, each an
`ImageSource` that also names its part (``messages[1].content[0]``), so an image's error points at it.
"""

from __future__ import annotations

from typing import Any, Sequence

from helios.errors import RequestError

DETAILS = ("auto", "low", "high")


class ImagePartError(RequestError):
    """A malformed image content part."""

    param = "messages"


def user_content(value: object, where: str) -> tuple[str, tuple[tuple[str, str], ...]] | None:
    """(joined text, parts) of a content array holding an image part; None when it holds none."""
    if not isinstance(value, list) or not any(isinstance(p, dict) and p.get("type") == "image_url" for p in value):
        return None
    texts, parts = [], []
    for i, part in enumerate(value):
        item = f"{where}.content[{i}]"
        if isinstance(part, dict) and part.get("type") == "image_url":
            parts.append(("image", _url(part, item)))
        elif isinstance(part, dict) and part.get("type") == "text" and set(part) == {"type", "text"}:
            if not isinstance(part["text"], str):
                raise ImagePartError(f"{item}.text must be a string")
            texts.append(part["text"])
            parts.append(("text", part["text"]))
        else:
            raise ImagePartError(f"{item} must be a text part {{type: text, text}} or an image_url part")
    return "\n".join(texts), tuple(parts)


def _url(part: dict, where: str) -> str:
    if set(part) != {"type", "image_url"}:
        raise ImagePartError(f"{where} has fields an image_url part does not take: "
                             f"{sorted(set(part) - {'type', 'image_url'})}")
    image = part["image_url"]
    if not isinstance(image, dict) or not isinstance(image.get("url"), str) or not image["url"]:
        raise ImagePartError(f"{where}.image_url must be an object with a non-empty url string")
    if set(image) - {"url", "detail"}:
        raise ImagePartError(f"{where}.image_url has unknown fields {sorted(set(image) - {'url', 'detail'})}")
    if image.get("detail") not in (None, *DETAILS):
        raise ImagePartError(f"{where}.image_url.detail must be one of {list(DETAILS)}")
    return image["url"]


def template_parts(parts: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    return [{"type": "image"} if kind == "image" else {"type": "text", "text": value} for kind, value in parts]


class ImageSource(str):
    """An image part's URL (the string itself) and `where` the part is in the request body."""

    where: str

    def __new__(cls, url: str, where: str) -> ImageSource:
        source = super().__new__(cls, url)
        source.where = where
        return source

    def __reduce__(self):
        return ImageSource, (str(self), self.where)


def image_urls(messages) -> list[ImageSource]:
    """Image URLs of parsed messages, in prompt order. A message's parts are its content's entries
    (`user_content` keeps every one), so part j of message i is ``messages[i].content[j]``."""
    return [ImageSource(value, f"messages[{i}].content[{j}]") for i, message in enumerate(messages)
            for j, (kind, value) in enumerate(message.parts) if kind == "image"]


def count_image_parts(messages: list[dict]) -> int:
    """Image parts of raw messages (any role: the request's schema admits them in user messages only)."""
    return sum(isinstance(part, dict) and part.get("type") == "image_url" for message in messages
               if isinstance(message, dict) and isinstance(message.get("content"), list)
               for part in message["content"])


def without_image_urls(messages: list[dict]) -> list[dict]:
    """Raw messages with each image part's URL left out (for text-size bounds: images have their own)."""
    def strip(message):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            return message
        kept = [p for p in content if not (isinstance(p, dict) and p.get("type") == "image_url")]
        return {**message, "content": kept}
    return [strip(m) for m in messages]
