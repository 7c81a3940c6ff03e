"""The eval partition: which problems are held out of training, by construction.

A problem is held out when a stable hash of its prompt text (BLAKE2b, 64 bits, read as a
fraction of 2**64) is below EVAL_SHARE. Membership depends on the problem's own text only:
not on `task.eval_size`, the seed, the level or which other problems exist. So a training
draw rejects the partition, never the drawn eval set, and is a pure function of (seed, step,
round); the warm start trains outside the partition too and does not depend on the eval set's
size; and `task.eval_size` only chooses how many held-out problems the eval scores (a prefix of
a fixed ordering of the partition, so a larger eval keeps the smaller one's problems).

A quarter: the default level (easy: operands 0..99, 10,000 ordered pairs) holds out 2,513
distinct problems, room for an eval of 2,000 drawn in the operand distribution; operands 10..99
(the W1 benchmark) hold out 2,060, medium 250,197 of 1,000,000. A smaller share would leave the
easy level under 2,000 (0.2: 2,050, a few dozen above), a larger one takes more problems from
training than an eval needs. Python's hash() is salted per process, so it would move the
partition from run to run: the hash is hashlib's.
"""
from __future__ import annotations

import hashlib

EVAL_SHARE = 0.25
# Named in a task's describe() (the warm start's cache key): a changed rule or share is another
# training distribution, so a warm start cached under the old one is never reused.
PARTITION = f"blake2b64<{EVAL_SHARE}"


def prompt_fraction(text: str) -> float:
    """`text`'s place in [0, 1): its BLAKE2b-64 digest over 2**64, the same in every process."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2 ** 64


def held_out(text: str) -> bool:
    """Whether the problem with this prompt (or question) text belongs to the eval partition."""
    return prompt_fraction(text) < EVAL_SHARE
