"""The request tools shared by the golden cases."""

from __future__ import annotations

from helios.frontend.parsers import ToolRegistry

OPENAI_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "units": {"enum": ["celsius", "fahrenheit"]},
                    "ratio": {"type": "number"},
                    "verbose": {"type": "boolean"},
                    "options": {"type": "object"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}},
        },
    },
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]

TOOLS = ToolRegistry.from_openai(OPENAI_TOOLS)

# A file body with markup-looking text, escapes and line breaks, for string values.
FILE_BODY = 'if a < b && c > "d":\n    print("<div>\\n</div>")\n'
