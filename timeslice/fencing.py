"""How an agent tells the fencing tokens its orchestrator issued from anyone else's.

An agent takes a token newer than any it has seen only if its orchestrator
issued it: taken, a token from the future would make every real command of
the group stale. Asking the orchestrator costs a round trip in every switch,
so the orchestrator proves its own tokens instead: the agent sends a secret key
of its session over its own connection to the orchestrator (`AgentReport`),
and the orchestrator's `SwitchGroup` carries an HMAC of the group, the token
and the orchestrator's epoch under that key. A token without a valid proof (a
direct Snapshot, a switch sent before the key was heard) is checked by asking.

The epoch is proven for the same reason: an agent refuses commands of an epoch
lower than the highest it has seen (a deposed orchestrator's), so one epoch
from the future, taken unproven, would make every real command stale.

Standard library only.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Final

KEY_BYTES: Final = 32


def new_key() -> bytes:
    """A fresh session key."""
    return secrets.token_bytes(KEY_BYTES)


def token_proof(key: bytes, group: str, token: int, *, epoch: int) -> bytes:
    """The proof, under `key`, that `token` of `group` and orchestrator `epoch` are
    the orchestrator's."""
    message = f"{group}\x00{token}\x00{epoch}".encode()
    return hmac.new(key, message, hashlib.sha256).digest()


def proves(key: bytes, group: str, token: int, proof: bytes, *, epoch: int) -> bool:
    """Whether `proof` is the one `token_proof(key, group, token, epoch=epoch)` makes."""
    if not (key and proof):
        return False
    return hmac.compare_digest(proof, token_proof(key, group, token, epoch=epoch))
