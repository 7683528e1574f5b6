"""The access log writes one line per request whatever its path holds: characters that are not
printable (U+0085 NEXT LINE, U+2028 LINE SEPARATOR, U+2029, U+202E RIGHT-TO-LEFT OVERRIDE and
other format characters) are escaped like controls and quotes. They were written as they came, so
a request for ``/x%E2%80%A8127.0.0.1:1 "GET /admin" 200`` read as two access-log lines to any
reader that splits lines as Unicode does (Python's ``str.splitlines``, JavaScript viewers)."""

from __future__ import annotations

import json

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


@pytest.mark.parametrize("name", ['my model', 'a" user="admin', f"m\n{FORGED}", "m\u2028x"])
def test_a_served_model_name_is_quoted_and_escaped_in_its_one_field(name):
    """The operator's `--served-model-name` was written bare: a space, a quote or a line end in it
    forged fields (``user="admin"``) or a whole line after ``model=``."""
    record = RequestRecord.now()
    record.model_name = name
    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "client": ("10.0.0.1", 5)}
    line = access_line(scope, 200, record)
    assert len(line.splitlines()) == 1 and line.isprintable()
    field = line.split(" model=", 1)[1]
    assert json.loads(field) == name  # the whole rest of the line is the one quoted name


def test_a_plain_model_name_reads_as_it_is():
    record = RequestRecord.now()
    record.model_name = "qwen3-модель"
    line = access_line({"type": "http", "method": "GET", "path": "/v1/models", "client": None}, 200, record)
    assert line.endswith(' model="qwen3-модель"')


@pytest.mark.parametrize("host", ['1.2.3.4 "GET /admin" 200', "1.2.3.4\x85127.0.0.1:1", 'a"b'])
def test_a_client_taken_from_a_forwarded_header_is_quoted_and_escaped(host):
    """uvicorn sets the client of a request from a trusted peer (127.0.0.1 by default) to its
    X-Forwarded-For text as written: spaces, quotes and U+0085 (a Latin-1 byte) forged fields or a line."""
    line = access_line({"type": "http", "method": "GET", "path": "/health", "client": (host, 0)}, 200,
                       RequestRecord.now())
    assert len(line.splitlines()) == 1 and line.isprintable()
    quoted, end = json.JSONDecoder().raw_decode(line)
    assert quoted == f"{host}:0" and line[end:].startswith(' "GET /health" 200 ')


@pytest.mark.parametrize("client", [("10.0.0.1", 5), ("::1", 80), ("fe80::1%eth0", 1)])
def test_an_address_stays_bare(client):
    line = access_line({"type": "http", "method": "GET", "path": "/health", "client": client}, 200,
                       RequestRecord.now())
    assert line.startswith(f'{client[0]}:{client[1]} "GET /health" 200 ')
