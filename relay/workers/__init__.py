"""``xds-relay run --workers N``: clients served by N processes, the origin followed by one.

A relay is one Python process, and one process uses one core. With
``server.workers`` above 1 the relay runs as N + 1 processes:

* the **hub** (the process started) holds the one stream to the origin, the
  cache and the admin server, and serves Delta ADS on a unix socket in a
  private temporary directory (``unix:/tmp/xds-relay-XXXX/hub.sock``);
* N **workers**, each a relay whose origin is that socket, serve the clients
  on ``server.address``, all on the same port (SO_REUSEPORT: the kernel
  spreads new connections between them).

The origin sees one stream with the configured node; the hub sees one stream
per worker, node id ``<node.id>/worker-<i>``. The hub restarts a worker that
exits (a backoff, logged); its clients reconnect to the others, or to it.
SIGTERM to the hub drains every worker and then stops the hub. The admin
server is the hub's: ``/ready`` counts the workers, ``/clients`` and
``/metrics`` gather theirs.

Modules: :mod:`~relay.workers.hub` (the hub: supervising, draining, admin),
:mod:`~relay.workers.worker` (a worker process), :mod:`~relay.workers.link`
(their control channel), :mod:`~relay.workers.metrics` (``/metrics`` merged).
"""

from relay.workers.hub import run_hub

__all__ = ["run_hub"]
