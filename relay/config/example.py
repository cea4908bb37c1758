"""A commented example config, covering every section (``xds-relay keys`` lists every key).

``config/example.yaml`` holds the same text, for operators to copy
(``tests/docs`` checks that the two agree and that the file validates).
"""

from __future__ import annotations

__all__ = ["EXAMPLE_CONFIG"]

EXAMPLE_CONFIG = """\
# xds-relay configuration. Check a file with: xds-relay validate --config FILE
node:                           # required: the identity presented to the origin
  id: relay-zone-a              # required
  cluster: xds-relay            # default: xds-relay
  locality: {region: eu-west1, zone: eu-west1-a, sub_zone: ""}
  metadata:                     # free-form; sent as a protobuf Struct
    team: platform
server:
  address: 127.0.0.1:18000      # downstream xDS (gRPC); IPv6 as "[::1]:18000". For a zone:
                                # 0.0.0.0:18000 with tls below (docs/deploying.md)
  batch_window: 5ms             # let an origin burst gather before pushing; 0 disables
  drain_period: 10s             # on SIGTERM, close client streams spread over this long
  max_connection_age: 30m       # retire client connections (GOAWAY, ±10 %): the fleet rebalances
  max_connection_age_grace: 10s # then streams still open end with UNAVAILABLE; 0 above: never
  max_response_size: 4MiB       # larger answers go over several (not SotW listeners, clusters)
  workers: 1                    # >1: that many processes serve clients on address, fed by one
                                # that follows the origin (docs/running.md, "Beyond one core")
  keepalive: {time: 30s, timeout: 10s}  # a client that froze or vanished is freed in time + timeout
  extra_type_urls: []           # type URLs served besides the xDS types the relay knows
  # tls:                        # TLS for clients; files re-read when they change
  #   cert_file: /etc/xds-relay/tls/tls.crt
  #   key_file: /etc/xds-relay/tls/tls.key
  #   client_ca_file: /etc/xds-relay/tls/ca.crt   # set: mutual TLS (a client certificate required)
  authorization:                # identities from client certificates (needs client_ca_file)
    allow: []                   # who may connect, e.g. ["spiffe://cluster.local/ns/*/sa/*",
                                # {prefix: "spiffe://cluster.local/ns/prod/"}]; []: any
    node_binding: none          # namespace (as istiod checks), id, or none
    debug: []                   # who may use CSDS and reflection, besides this host
    debug_loopback: true        # 127.0.0.1, ::1 and unix sockets may use CSDS and reflection
                                # (behind a sidecar every client comes from 127.0.0.6: not these)
    # secrets:                  # who may have which Secret; unset: any client with a
    #                           # certificate has all, one without none; []: no client
    #   - identities: ["spiffe://cluster.local/ns/{namespace}/sa/*"]
    #     names: ["kubernetes://{namespace}/*"]   # {namespace}: the one the identity names
upstream:                       # required: exactly one of address or files
  address: 127.0.0.1:18001      # origin control plane, followed over Delta ADS
  # files: config/resources     # or: serve a directory of YAML/JSON resource files
  poll_interval: 1s             # rescan period of `files`; > 0
  backoff: {initial: 0.5s, max: 30s}   # reconnect backoff; durations: 500ms 1.5s 2m 1h
  linger: 30s                   # keep an upstream subscription this long after its last client
                                # left: one reconnecting (connection age, a replica gone) finds it
  answer_grace: 500ms           # a response sooner than this after a subscription may not answer it
  # tls:                        # TLS to the origin (istiod's secured port 15012)
  #   ca_file: /var/run/secrets/istio/root-cert.pem   # PEM roots; default: the system's
  #   server_name: istiod.istio-system.svc            # checked against the origin's certificate
  #   cert_file: /etc/xds-relay/tls/cert.pem          # optional client certificate (mTLS) ...
  #   key_file: /etc/xds-relay/tls/key.pem            # ... and its key
  # token_file: /var/run/secrets/tokens/istio-token # re-read at every connect; sent as Bearer
  initial_metadata: {}          # extra gRPC headers, e.g. {clusterid: Kubernetes} for istiod
  keepalive: {time: 30s, timeout: 10s}   # istiod refuses pings more often than every 15 s
  connect_timeout: 5s           # TCP + TLS + HTTP/2 handshake, before an attempt counts as failed
  max_response_size: 2GiB       # largest origin response accepted (gRPC's limit)
  max_request_size: 1MiB        # larger subscriptions are split into several requests
  initial_versions: auto        # does the origin honour initial_resource_versions? auto,
                                # honoured or ignored (istiod ignores them)
admin:
  address: 127.0.0.1:19000      # /ready /healthz /config_dump /clients /metrics
  # tls: {cert_file: /etc/xds-relay/tls/tls.crt, key_file: /etc/xds-relay/tls/tls.key}
  # token_file: /etc/xds-relay/admin/token   # Bearer token for all but /healthz and /ready
  header_timeout: 10s           # a request's headers, from their first byte; then 408, closed
  idle_timeout: 60s             # a connection waiting for its next request (or its first)
  connections_per_host: 100     # open at once from one client address; one more: 429
logging:
  level: info                   # debug, info, warning or error
  format: text                  # text (key=value) or json (one object per line)
metrics:                        # always scraped at http://ADMIN/metrics (Prometheus)
  # otlp:                       # and optionally pushed to an OpenTelemetry collector
  #   endpoint: http://otel-collector:4318/v1/metrics   # OTLP/HTTP, JSON encoding
  #   interval: 15s
limits:                         # what one client may ask; beyond: RESOURCE_EXHAUSTED naming the key
  streams: 100000               # open at once, all clients together
  streams_per_connection: 100   # also HTTP/2's MAX_CONCURRENT_STREAMS
  streams_per_host: 1000        # one client host (address), all its connections
  connections_per_host: 100     # connections with a stream open, one client host
  new_streams_per_second: 500   # taken a second, after a burst; beyond: UNAVAILABLE (retry)
  new_streams_burst: 1000
  leases_per_host: 100          # resource sets one host's REST polls keep subscribed
  names_per_request: 100000     # names (and locators) one request subscribes or unsubscribes
  names_per_stream: 200000      # all types together
  name_length: 4096             # characters
  node_size: 64KiB              # a client's encoded Node
  dynamic_parameters: 64        # per locator (or per type of the Node)
  request_size: 16MiB           # one encoded request
  upstream_names: 200000        # names clients make the relay subscribe on its origin stream
  upstream_names_per_host: 100000   # ... of which one client host's streams and polls
rest:                           # Envoy's REST-JSON polling (api_type: REST); off by default
  # address: 0.0.0.0:18080      # POST /v3/discovery:clusters ...; TLS, authorization: server.*
  lease: 60s                    # keep a poll's resources subscribed this long after its last poll
  wait: 500ms                   # a poll of what is not cached yet waits this long for the origin
  header_timeout: 10s           # a poll's headers, from their first byte; then 408, closed
  body_timeout: 30s             # a poll's body, once its headers are in; then 408, closed
  idle_timeout: 60s             # a connection waiting for its next poll (or its first)
  max_buffered_body: 64MiB      # body bytes held at once, all polls; beyond: 503 (per process)
  connections_per_host: 100     # open at once from one client address; one more: 429
# persistence:                  # keep the last-known-good config across restarts (off by default)
#   redis:                      # shared by the zone's replicas ...
#     url: redis://redis:6379/0 # rediss:// for TLS; a password in the URL or in password_file
#     key_prefix: xds-relay:zone-a   # default: xds-relay:<node.cluster>[:<node.locality.zone>]
#     timeout: 1s               # each Redis operation; clients never wait for Redis
#   # directory: /var/lib/xds-relay  # ... or a local directory (one relay)
#   load_timeout: 1s            # at start, serve without the snapshot if it takes longer
"""
