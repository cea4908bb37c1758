"""The live console at ``/`` on the admin port: a page served by the relay
itself (HTML, CSS and a little JavaScript from the package; no CDN, no
build step) that polls one JSON endpoint once a second and shows the
origins, the cache, the clients (searched, sorted and paged on the relay,
worst first), a page per client and charts of the relay's recent history.

One module per idea:

* :mod:`relay.console.history`: the ring of one point a second, and its sampler;
* :mod:`relay.console.clients`: the client list's rows, queries, pages and their merge;
* :mod:`relay.console.source`: where clients and readings come from (this
  process, or the workers of ``--workers``);
* :mod:`relay.console.data`: the JSON views of readiness, origins, cache, a client;
* :mod:`relay.console.auth`: signing in behind ``admin.token_file`` (a cookie);
* :mod:`relay.console.server`: the routes, on the admin server's aiohttp server;
* ``static/``: the page, its stylesheet and its script.

The admin server starts a :class:`~relay.console.server.Console` with the
:class:`~relay.console.source.ConsoleSource` it was given.
"""
