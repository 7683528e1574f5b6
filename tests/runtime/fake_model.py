"""A deterministic stand-in for captured programs, driven only by `StepPlan`s.

The fake keeps real physical storage: `pages[page][offset]` holds the token id written at that
position, continuation rows and host slots hold copied payloads, each slot remembers its page
table (extended only by the entries a row sends) and its device-owned pending token. The next
token is a hash of the context *read back through the page table*, so any wrong page table,
premature reuse of a page, missed copy or stale slot changes the output. With `stateful` the
slot also carries a running state (like a recurrent region) that the sample depends on.

With `window` W > 0 (a sliding-window model) the next token depends only on the last W tokens,
and only their pages are read, so a page released too early (and reused) changes the output.

`reference` computes the same function directly from the token list.
"""

from __future__ import annotations

import hashlib
from array import array
from typing import Sequence

from helios.runtime.records.capacities import Capacities, Operation
from helios.runtime.records.plan import CopyOp, PlanRow, RowResult, StepPlan, StorageKind

VOCAB = 97


def next_token(context: Sequence[int], state: int = 0) -> int:
    digest = hashlib.blake2b(array("q", context).tobytes(), digest_size=8, key=state.to_bytes(8, "little"))
    return int.from_bytes(digest.digest(), "little") % VOCAB


def advance_state(state: int, token: int) -> int:
    return (state * 1_000_003 + token + 1) % (1 << 61)


def draft_token(context: Sequence[int], state: int = 0) -> int:
    """A draft model that agrees with the target three times in four."""
    target = next_token(context, state)
    return target if hash(tuple(context[-3:])) % 4 else (target + 1) % VOCAB


def reference(prompt: Sequence[int], max_output: int, eos_ids=frozenset(), stateful: bool = False,
              window: int = 0) -> list[int]:
    context = list(prompt)
    state = 0
    if stateful:
        for token in context[:-1]:
            state = advance_state(state, token)
    output: list[int] = []
    while len(output) < max_output:
        if stateful:
            state = advance_state(state, context[-1])
        token = next_token(context[-window:] if window else context, state if stateful else 0)
        output.append(token)
        context.append(token)
        if token in eos_ids:
            break
    return output


class FakeExecutor:
    def __init__(self, caps: Capacities, stateful: bool = False, window: int = 0):
        self.caps = caps
        self.window = window
        self.page_tokens = caps.page_tokens
        self.stateful = stateful
        self.pages = [[-1] * self.page_tokens for _ in range(caps.cache.num_pages)]
        self.rows: dict[int, dict] = {}
        self.host: dict[int, dict] = {}
        self.tables: dict[int, tuple[int, list[int]]] = {}
        self.pending: dict[int, int] = {}
        self.state: dict[int, int] = {}
        self.num_copies = 0

    def run(self, plan: StepPlan) -> list[RowResult]:
        for copy in plan.copies:
            self._copy(copy)
        lag = plan.variant.draft_lag_tokens if plan.variant is not None else None
        results = []
        for row in plan.rows:
            if plan.operation == Operation.SPECULATIVE:
                results.append(self._speculate(row, lag))
            else:
                results.append(self._run_row(row))
        return results

    # -- storage -------------------------------------------------------------------------------

    def _copy(self, copy: CopyOp) -> None:
        """Pages and slot state are single values; continuation rows and host slots are records
        holding the copied page tokens and/or state side by side. As in the real storage
        (`helios.runtime.execution.history_storage`), a copy moves the first `num_tokens` tokens
        (none when 0) and the whole state: a record's other part is left as it was."""
        self.num_copies += 1
        src, dst = copy.src, copy.dst
        if src.kind == StorageKind.PAGE:
            payload = {"tokens": self.pages[src.index][:copy.num_tokens]}
        elif src.kind == StorageKind.STATE:
            payload = {"state": self.state[src.index]}
        else:
            payload = dict(self._store(src.kind)[src.index])
        if dst.kind == StorageKind.PAGE:
            assert len(payload["tokens"]) >= copy.num_tokens, "copy of a payload that was never written"
            self.pages[dst.index][:copy.num_tokens] = payload["tokens"][:copy.num_tokens]
        elif dst.kind == StorageKind.STATE:
            self.state[dst.index] = payload["state"]
        else:
            if src.kind not in (StorageKind.PAGE, StorageKind.STATE) and "tokens" in payload:
                tokens = payload.pop("tokens")[:copy.num_tokens]
                if tokens:
                    payload["tokens"] = tokens
            self._store(dst.kind).setdefault(dst.index, {}).update(payload)

    def _store(self, kind: StorageKind) -> dict[int, dict]:
        return self.rows if kind == StorageKind.CONTINUATION else self.host

    def _table(self, row: PlanRow) -> list[int]:
        generation, table = self.tables.get(row.slot, (None, []))
        if row.admits:
            generation, table = row.generation, []
            if row.start_pos == 0:
                self.state[row.slot] = 0
        assert generation == row.generation, "stale slot generation"
        assert row.page_table_start == len(table), "page-table upload out of order"
        table.extend(row.new_page_ids)
        self.tables[row.slot] = (generation, table)
        return table

    def _write(self, table: list[int], position: int, token: int) -> None:
        self.pages[table[position // self.page_tokens]][position % self.page_tokens] = token

    def _context(self, table: list[int], end: int) -> list[int]:
        """The tokens at positions [0, end), or only the last `window` of them."""
        begin = max(0, end - self.window) if self.window else 0
        first = begin // self.page_tokens
        context: list[int] = []
        for page in table[first: -(-end // self.page_tokens)]:
            context.extend(self.pages[page])
        return context[begin - first * self.page_tokens: end - first * self.page_tokens]

    # -- programs ------------------------------------------------------------------------------

    def _run_row(self, row: PlanRow) -> RowResult:
        table = self._table(row)
        tokens = (self.pending[row.slot],) if row.pending_on_device else row.token_ids
        assert len(tokens) == row.query_len
        for offset, token in enumerate(tokens):
            self._write(table, row.start_pos + offset, token)
            if self.stateful:
                self.state[row.slot] = advance_state(self.state[row.slot], token)
        end = row.start_pos + row.query_len
        emitted: tuple[int, ...] = ()
        if row.samples:
            token = next_token(self._context(table, end), self.state.get(row.slot, 0) if self.stateful else 0)
            self.pending[row.slot] = token
            emitted = (token,)
        return RowResult(row.slot, row.generation, end, emitted, row.query_len)

    def _speculate(self, row: PlanRow, lag: int | None) -> RowResult:
        table = self._table(row)
        position = row.start_pos
        self._write(table, position, row.token_ids[0])
        emitted: list[int] = []
        for _ in range(row.query_len - 1):
            context = self._context(table, position + 1)
            target, proposal = next_token(context), draft_token(context)
            self._write(table, position + 1, proposal)  # rejected positions hold garbage
            if proposal != target:
                emitted.append(target)
                break
            emitted.append(proposal)
            position += 1
        else:
            emitted.append(next_token(self._context(table, position + 1)))
        consumed = row.start_pos + len(emitted)
        self.pending[row.slot] = emitted[-1]
        cursor = -1 if lag is None else max(consumed - lag, 0)
        return RowResult(row.slot, row.generation, consumed, tuple(emitted), row.query_len,
                         len(emitted) - 1, cursor)
