"""The one retry policy of delivery: exponential backoff, capped, honouring a receiver's
Retry-After, giving up after a day. Pure.

Every retry of the delivery path goes through it: a notification that failed waits in the
outbox for :meth:`RetryPolicy.delay` (the notifiers themselves make a single attempt), and a
brake the control channel could not take is tried again after the same delays, without ever
giving up (:attr:`RetryPolicy.give_up_after` applies to notifications only).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RetryPolicy", "backoff"]


def backoff(attempts: int, base: float = 1.0, cap: float = 300.0) -> float:
    """Seconds before the next try after ``attempts`` failures: base, 2 x base, 4 x base, ...
    capped.

    >>> [backoff(n) for n in (1, 2, 3, 10, 20)]
    [1.0, 2.0, 4.0, 300.0, 300.0]
    """
    return min(cap, base * 2 ** max(0, min(attempts - 1, 30)))


@dataclass(frozen=True)
class RetryPolicy:
    """``base`` and ``cap`` of the backoff (seconds); ``give_up_after``: a notification still
    failing this long after it was first queued goes to the dead letters."""

    base: float = 1.0
    cap: float = 300.0
    give_up_after: float = 86400.0

    def __post_init__(self):
        if self.base <= 0 or self.cap < self.base or self.give_up_after <= 0:
            raise ValueError(f"retry policy needs 0 < base <= cap and give_up_after > 0, got {self}")

    def delay(self, attempts: int, retry_after: float | None = None) -> float:
        """Seconds to wait after ``attempts`` failures; at least what the receiver asked for.

        >>> RetryPolicy(base=2.0, cap=10.0).delay(3), RetryPolicy().delay(1, retry_after=30.0)
        (8.0, 30.0)
        """
        return max(retry_after or 0.0, backoff(attempts, self.base, self.cap))

    def exhausted(self, first_try: float, now: float) -> bool:
        return now - first_try >= self.give_up_after
