"""The access log writes one line per request whatever its path holds: characters that are not
printable (U+0085 NEXT LINE, U+2028 LINE SEPARATOR, U+2029, U+202E RIGHT-TO-LEFT OVERRIDE and
other format characters) are escaped like controls and quotes. They were written as they came, so
a request for ``/x%E2%80%A8127.0.0.1:1 "GET /admin" 200`` read as two access-log lines to any
reader that splits lines as Unicode does (Python's ``str.splitlines``, JavaScript viewers)."""

from __future__ import annotations

import pytest

from helios.server.access import access_line
from helios.server.request_metrics import RequestRecord

FORGED = '127.0.0.1:1 "GET /admin" 200'


@pytest.mark.parametrize(("char", "escape"), [
    ("\u2028", "\\u2028"), ("\u2029", "\\u2029"), ("\x85", "\\u0085"), ("\x1c", "\\u001c"), ("\n", "\\n"),
    ("\u202e", "\\u202e"), ("\u200b", "\\u200b"), ("\x9b", "\\u009b"),
])
def test_a_path_with_a_line_or_format_character_is_one_escaped_line(char, escape):
    scope = {"type": "http", "method": "GET", "path": f"/x{char}{FORGED}", "client": ("10.0.0.1", 5)}
    line = access_line(scope, 404, RequestRecord.now())
    assert len(line.splitlines()) == 1 and line.isprintable()
    assert f'"GET /x{escape}127.0.0.1:1 \\"GET /admin\\" 200" 404 ' in line


def test_printable_unicode_in_a_path_stays_readable():
    scope = {"type": "http", "method": "GET", "path": "/v1/models/модель-é 1", "client": None}
    assert access_line(scope, 404, RequestRecord.now()).startswith('- "GET /v1/models/модель-é 1" 404 ')
