"""Prompt groups: requests with the same prompt share its pages at admission.

The `n` choices of one request (and `best_of` candidates, repeated prompts in a batch) are
separate requests with identical prompts: same chain root (cache identity and salt) and the same
keyed prompt tokens (image tokens keyed by their image's content hash). They form a *prompt
group*, keyed by one digest of the root and the whole prompt. The first member admitted (the
source) prefills the prompt; while a running member is still computing the prompt's first P - 1
tokens and none has them, a later member waits (`is_waiting_for_source`) instead of prefilling the
same tokens itself. Then it is admitted onto a source's pages (`CacheManager.admit`):

- pages [0, (P - 1) // page_tokens) are shared by reference: the source published them to the
  prefix cache when it committed them (a sliding-window source may have released some since; they
  stay cached until evicted), every position in them is committed and no one writes them again;
- the page holding position P - 1 is a fresh private page whose first (P - 1) % page_tokens tokens
  are copied from the source's page (a PAGE -> PAGE copy that the admitting plan runs ahead of its
  program; the source writes that page only at positions >= P);
- the member computes one token, position P - 1, and samples its first output with its own seed
  (its table also takes the layout's lookahead pages after that page, as any table covering P does).

So n members compute P + (n - 1) prompt tokens and take ceil(P / page_tokens) + (n - 1) pages at
admission, where separate prefills compute n * P tokens and take n * ceil(P / page_tokens) pages. (Should a complete page have been evicted meanwhile, the member is
admitted from the prefix cache as any request is.)

Only layouts whose pages hold a prefix's whole state share this way (not one with a window region of
its own page ids, whose pages the member would lack: its members reuse the prompt through both
prefix caches, `window_pages`), and only with prefix caching on; a request that must score its
prompt, or that has outputs already (readmitted after preemption), neither waits nor shares, but
may serve as a source. Membership follows the request's page table (joined at admission, left at
release).

A held prompt: the last member holding the prompt may end while requests of its group still wait
(a choice whose first token ends it: an output limit of one, a stop or EOS drawn first, a
cancellation), typically before the others were admitted at all. Released, its page of the last
prompt token would be freed: the next waiting member would recompute that page (the whole prompt
when it is shorter than a page) while the others waited a step more for it (and did it again in
turn, each choice ending at its first token). So the scheduler has the cache hold the prompt
instead (`CacheManager.hold_prompt`; never for a request of a failed plan, whose copies may not
have run): a `HeldPrompt` keeps one reference to each page of the prompt's first P - 1 tokens the
member still held, and the waiting members are admitted onto it together, exactly as onto a running
source. The hold is dropped once no request of the group waits (`CacheManager.drop_holds`, outside
step composition, so a plan that copied from it was launched before its pages can be allocated
again, and runs first), and under page pressure before a running request is preempted
(`CacheManager.allocate`): a member admitted after that reuses the prompt from the prefix cache as
any request does.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from helios.runtime.cache.prefix_cache import page_digest
from helios.runtime.records.request import RELEASED_PAGE, RequestState, RequestStatus


def prompt_key(req: RequestState, keyed_ids: Sequence[int]) -> bytes:
    """The group digest: the request's chain root and its keyed prompt tokens."""
    return page_digest(req.root, keyed_ids[:req.num_prompt_tokens])


def waiting_key(req: RequestState) -> bytes:
    """The group key under which a queued request may wait to be admitted onto a member's prompt
    (b"": none): it scores no prompt and has no outputs yet (the layout's part is `CacheManager`'s)."""
    return req.prompt_key if req.num_output_tokens == 0 and not req.spec.score_prompt else b""


class HeldPrompt(NamedTuple):
    """A prompt kept for its group's waiting members after its last holder ended (module docstring)."""

    page_ids: tuple[int, ...]  # one reference each, owned by the hold
    tail_page: int  # the page of the last prompt token (RELEASED_PAGE: P - 1 starts a page, nothing to copy)


def tail_page(member: RequestState, page_tokens: int) -> int:
    """The page whose leading tokens a member admitted onto `member` copies (RELEASED_PAGE: none)."""
    index, partial = divmod(member.num_prompt_tokens - 1, page_tokens)
    return member.page_ids[index] if partial else RELEASED_PAGE


def holds_prompt(member: RequestState, page_tokens: int, running: bool = True) -> bool:
    """`member` (running, unless `running` is False: a finished member about to be released) has
    committed its prompt's first P - 1 tokens and still holds the page of the last prompt token
    when that page has leading prompt tokens to copy (the complete pages before it are shared
    through the prefix cache, where the member published them)."""
    needed = member.num_prompt_tokens - 1
    if (running and member.status != RequestStatus.RUNNING) or member.num_computed_tokens < needed:
        return False
    index, partial = divmod(needed, page_tokens)
    return not partial or (len(member.page_ids) > index and member.page_ids[index] != RELEASED_PAGE)


class PromptGroups:
    """Members (requests holding pages) and held prompts by prompt key. Mutated by `CacheManager`
    only, which owns the held prompts' page references."""

    def __init__(self, page_tokens: int):
        self.page_tokens = page_tokens
        self._members: dict[bytes, list[RequestState]] = {}
        self._keys: dict[str, bytes] = {}
        self.held: dict[bytes, HeldPrompt] = {}
        self.num_shared_admissions = 0
        self.num_holds = 0  # prompts held for waiting members since the start

    def join(self, req: RequestState, key: bytes) -> None:
        """`req` now holds pages with its prompt's history (or will compute it)."""
        if req.request_id not in self._keys:
            self._keys[req.request_id] = key
            self._members.setdefault(key, []).append(req)

    def leave(self, req: RequestState) -> None:
        """`req` dropped its pages (release, preemption, checkpoint)."""
        key = self._keys.pop(req.request_id, None)
        if key is None:
            return
        members = self._members[key]
        members.remove(req)
        if not members:
            del self._members[key]

    def source(self, key: bytes) -> int | None:
        """The page a member admitted now copies its last prompt token's leading tokens from
        (RELEASED_PAGE: nothing to copy): of the held prompt, else of the first member whose pages
        hold the prompt's first P - 1 tokens (a member admitted in the step being composed comes
        after the one it copies from); None when neither holds them."""
        held = self.held.get(key)
        if held is not None:
            return held.tail_page
        for member in self._members.get(key, ()):
            if holds_prompt(member, self.page_tokens):
                return tail_page(member, self.page_tokens)
        return None

    def has_other_holder(self, req: RequestState, key: bytes) -> bool:
        """A member besides `req`, or a held prompt, holds the prompt's first P - 1 tokens."""
        return key in self.held or any(
            member is not req and holds_prompt(member, self.page_tokens) for member in self._members.get(key, ()))

    def is_computing(self, key: bytes) -> bool:
        """A running member has yet to commit the prompt's first P - 1 tokens."""
        return any(m.status == RequestStatus.RUNNING and m.num_computed_tokens < m.num_prompt_tokens - 1
                   for m in self._members.get(key, ()))

    @property
    def num_members(self) -> int:
        return len(self._keys)
