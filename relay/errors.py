"""The root of the relay's own exceptions.

Every exception class defined in ``relay/`` derives from :class:`RelayError`,
so ``except RelayError`` tells the relay's own failures (a bad config, a
request that breaks the protocol, an origin response to NACK, ...) from bugs
and from the libraries' errors. A class that callers also catch as a builtin
(``ValueError`` for a value that does not parse) keeps that base beside this
one, so no ``except ValueError`` changes meaning.

This module imports nothing from the relay, so any module may import it.
"""

from __future__ import annotations

__all__ = ["RelayError"]


class RelayError(Exception):
    """A failure the relay defines and names; each subclass says what it means."""
