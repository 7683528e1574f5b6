"""The records every runtime room shares: the step plan (`plan`), prepared capacities
(`capacities`), per-request records (`request`), scheduler events (`events`), execution faults
(`faults`) and worker counters (`stats`). Imports no other room."""
