"""The ASGI scope of a JSON POST, for tests that drive the app's ASGI callable directly (to control
when the client's body arrives and when it leaves)."""

from __future__ import annotations


def post_scope(path: str, body: bytes, extra_headers: tuple[tuple[bytes, bytes], ...] = ()) -> dict:
    """An HTTP/1.1 POST of the JSON `body` to `path` from 127.0.0.1, with `extra_headers` after the
    host, content type and length."""
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
            "headers": [(b"host", b"test"), (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()), *extra_headers],
            "client": ("127.0.0.1", 5000), "server": ("test", 80), "state": {}}
