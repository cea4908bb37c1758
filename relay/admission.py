"""Admission: how fast new streams are taken (``limits.new_streams_per_second``).

When a replica dies, all its clients arrive at the others at once. Taking
them all as fast as they come holds up the clients already served (every new
stream is answered from the cache, on the one event loop); turning the
excess away lets them back off and land, perhaps, on another replica.
:class:`TokenBucket` decides, without I/O: a stream within the rate (and its
burst) goes at once, one a little over it waits its turn for at most
``max_wait``, and the rest are refused. Streams already open are never
touched.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["ADMISSION_WAIT", "TokenBucket"]

#: The longest a new stream waits for its turn before it is refused, in seconds:
#: about what a client's first reconnect backoff would cost it anyway.
ADMISSION_WAIT = 1.0


class TokenBucket:
    """``rate`` admissions a second, ``burst`` of them at once.

    Each admission takes a token; tokens come back at ``rate`` a second, up to
    ``burst``. An admission that finds none reserves the next one to come,
    and is told how long to wait for it; one that would wait longer than
    ``max_wait`` is refused and takes nothing, so a storm costs the bucket no
    more than the waits it grants.
    """

    def __init__(self, rate: float, burst: int, now: Callable[[], float],
                 max_wait: float = ADMISSION_WAIT) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("a token bucket needs a rate above 0 and a burst of at least 1")
        self.rate = rate
        self.burst = burst
        self.max_wait = max_wait
        self._now = now
        self._tokens = float(burst)
        self._at = now()

    def reserve(self) -> float | None:
        """Seconds to wait before going ahead (0: at once), or None: refused."""
        now = self._now()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return 0.0
        wait = (1 - self._tokens) / self.rate
        if wait > self.max_wait:
            return None
        self._tokens -= 1  # the next token to come is this one's
        return wait
