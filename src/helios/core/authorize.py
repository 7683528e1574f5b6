"""Authorization: may this operator serve a core signed by these keys under this namespace?

`authorize` runs after every envelope signature verified (`envelope.check_signatures`) and before
anything beyond the signed payload's publisher terms is interpreted. It succeeds only when

1. at least one signer is a key the operator trusts (else `UntrustedSignerError`),
2. the acceptance string equals the signed publisher namespace exactly: no case folding, trimming
   or prefix matching (else `NamespaceMismatchError`), and
3. one of those trusted signers is trusted for that namespace (else `KeyScopeError`).
"""

from __future__ import annotations

from helios.core.errors import KeyScopeError, NamespaceMismatchError, UntrustedSignerError
from helios.core.keys import PublicKey, TrustedKeys


def trusted_signers(signers: tuple[PublicKey, ...], trusted: TrustedKeys) -> tuple[PublicKey, ...]:
    """The operator's entries (with their namespace scopes) for the signers it trusts."""
    found = []
    for signer in signers:
        entry = trusted.get(signer.key_id)
        if entry is not None and entry.raw == signer.raw:
            found.append(entry)
    return tuple(found)


def authorize(
    namespace: str,
    signers: tuple[PublicKey, ...],
    trusted: TrustedKeys,
    acceptance: str,
) -> tuple[PublicKey, ...]:
    """The trusted signers that admit `namespace`; raises SignatureError/AuthorizationError."""
    candidates = trusted_signers(signers, trusted)
    if not candidates:
        ids = ", ".join(s.key_id.hex() for s in signers)
        raise UntrustedSignerError(f"no trusted key signed the core (signed by {ids})")
    if not isinstance(acceptance, str) or acceptance != namespace:
        raise NamespaceMismatchError(
            f"acceptance {acceptance!r} does not equal the publisher namespace {namespace!r}"
        )
    admitted = tuple(key for key in candidates if key.admits(namespace))
    if not admitted:
        raise KeyScopeError(f"the trusted signers are not trusted for namespace {namespace!r}")
    return admitted
