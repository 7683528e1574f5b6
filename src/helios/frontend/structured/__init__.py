"""Structured output: request grammars and their matcher (`grammar`), the Lark grammars of tool
calls, channels, frames and values, a request's grammar (`grammar_request`) and the contract's
frontend syntax (`contract_syntax`). Uses `decoding`, `preparation` and `parsers`."""
