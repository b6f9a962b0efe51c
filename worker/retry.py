"""Retry as a pure function of the attempt and the failure.

JetStream's delivery count is the attempt counter: a transient failure on delivery ``n`` is handed
back with ``nak(delay)``; on the last allowed delivery the failure becomes the task's result.
"""

from __future__ import annotations

import random

BASE_DELAY_S = 1.0
MAX_DELAY_S = 60.0


def retry_delay(
    delivered: int, max_deliver: int, transient: bool, rng: random.Random | None = None
) -> float | None:
    """Seconds to wait before the next attempt, or None when the failure is final.

    ``delivered`` is JetStream's delivery count of this attempt (1 for the first). The delay doubles
    per attempt from ``BASE_DELAY_S`` up to ``MAX_DELAY_S``, with full jitter in its upper half.
    """
    if not transient or delivered >= max_deliver:
        return None
    ceiling = min(MAX_DELAY_S, BASE_DELAY_S * 2 ** (delivered - 1))
    return ceiling / 2 + (rng or random).random() * ceiling / 2
