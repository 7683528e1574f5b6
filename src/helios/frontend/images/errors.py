"""Typed errors of image inputs: every one a client's mistake (HTTP 400) naming the problem."""

from __future__ import annotations

from helios.errors import RequestError


class ImageRejected(RequestError):
    """An image input that cannot be used: malformed, oversized, truncated, not an image, or outside
    the request's image bounds. The message names the problem."""

    param = "messages"

    def at(self, where: str | None) -> ImageRejected:
        """This error located at one image part (``messages[1].content[0]``): the message starts with
        the place and `param` names it; unchanged when the place is unknown."""
        return self if not where else ImageRejected(f"{where}: {self}", where)
