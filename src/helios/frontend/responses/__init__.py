"""From token events to responses: the output processor (`output`: detokenizing, stops and parsers
per token) and presentation of response bodies and stream chunks. Uses `decoding`, `preparation`
and `parsers`."""
