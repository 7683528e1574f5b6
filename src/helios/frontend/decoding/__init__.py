"""Generated tokens to text and events: incremental detokenizing, text bounds, stop matching,
log-probabilities, observation, the parsers' event records and output syntax. Uses no other
frontend room."""
