"""Page digests are the chained blake2b of the spec: the parent's digest then the page's int64
token ids, under the 'helios-page' personalisation (a prototype hasher is copied per page: the same
digests as building each hasher), and a chain extends page by page to the same digests."""

from __future__ import annotations

import hashlib
import random
from array import array

from helios.runtime.cache.prefix_cache import DIGEST_BYTES, extend_chain, page_digest, root_digest


def _reference(parent: bytes, tokens) -> bytes:
    return hashlib.blake2b(parent + array("q", tokens).tobytes(), digest_size=DIGEST_BYTES,
                           person=b"helios-page").digest()


def test_page_digests_and_chains_are_the_reference_blake2b():
    rng = random.Random(5)
    root = root_digest(b"identity", b"salt")
    tokens = [rng.randrange(0, 1 << 40) for _ in range(16 * 9 + 5)]
    expected, parent = [], root
    for page in range(9):
        parent = _reference(parent, tokens[page * 16:(page + 1) * 16])
        expected.append(parent)
    assert page_digest(root, tokens[:16]) == expected[0]
    chain: list[bytes] = []
    extend_chain(chain, root, tokens, 16, 4)
    extend_chain(chain, root, tokens, 16, 9)  # continued from the fourth page
    extend_chain(chain, root, tokens, 16, 9)  # nothing left to add
    assert chain == expected


def test_a_cold_admission_digests_what_its_lookup_reads_and_the_rest_while_its_plan_runs():
    from runtime.harness import make, spec

    scheduler, driver = make(page_tokens=4)
    driver.submit(spec("cold", range(1, 41), 2))
    driver.step()  # the cold prompt's plan is launched: its lookup read one page digest
    req = scheduler.queues.requests["cold"]
    assert len(req.chain) == 1
    driver.step()  # a second frame is asked for while the plan runs: the other digests now
    full: list[bytes] = []
    extend_chain(full, req.root, list(range(1, 41)), 4, 10)
    assert req.chain == full
    outcomes = driver.run()
    assert len(outcomes["cold"].tokens) == 2


def test_a_prefix_hit_is_found_through_the_digests_read_until_the_first_missing_page():
    from runtime.harness import make, spec

    scheduler, driver = make(page_tokens=4)
    driver.submit(spec("first", range(1, 41), 1))
    driver.run()
    driver.submit(spec("second", list(range(1, 25)) + list(range(60, 76)), 1))
    driver.step()
    req = scheduler.queues.requests["second"]
    assert req.num_reused_tokens == 24 and len(req.chain) == 7  # six cached pages and the first missing one
    outcomes = driver.run()
    assert outcomes["second"].finish.num_reused_tokens == 24
