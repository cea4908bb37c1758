"""The last-known-good snapshot: the cache persisted, so that a restarted
relay serves its zone while the origin is away.

:mod:`~relay.persistence.entries` encodes one name's variants (no I/O);
:mod:`~relay.persistence.stores` keeps entries in Redis (through aiocache)
or a local directory; :mod:`~relay.persistence.writer` writes what the cache
changed; :mod:`~relay.persistence.restore` loads a snapshot into the cache
before the relay serves.
"""
