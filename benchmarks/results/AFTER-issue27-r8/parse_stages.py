"""Stages of plain_resources on a 2,000 x 300 B response."""
import sys, time, statistics
sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else ".")
from benchmarks.cold_path import origin_responses, ENDPOINT
from envoy.service.discovery.v3 import discovery_pb2
from relay.upstream import bulk
from relay.upstream.responses import parse_response
from relay.runtime import tune_gc
enc = origin_responses(10000, 300, 2000)
tune_gc()
found = bulk.shadows(ENDPOINT)
def t(f, n=20):
    xs = []
    for _ in range(n):
        s = time.perf_counter(); f(); xs.append((time.perf_counter() - s) * 1e3)
    return f"{min(xs):.2f}/{statistics.median(xs):.2f}"
raw = enc[0]
resp = discovery_pb2.DeltaDiscoveryResponse.FromString(raw)
print("FromString response", t(lambda: discovery_pb2.DeltaDiscoveryResponse.FromString(raw)))
print("Serialize", t(lambda: resp.SerializeToString()))
e = resp.SerializeToString()
print("same bytes", e == raw)
print("listed", t(lambda: bulk._plain_listed(found, e, ENDPOINT, 2000)))
print("entries parse", t(lambda: found.entries.FromString(e).resources))
pl = found.entries.FromString(e).resources
print("entries list", t(lambda: list(found.entries.FromString(e).resources)))
ent = [bulk._entry_prefix(len(p)) + p for p in pl]
print("frame", t(lambda: [bulk._entry_prefix(len(p)) + p for p in pl]))
j = b"".join(ent)
print("checked parse", t(lambda: found.checked.FromString(j)))
names, versions = bulk._plain_listed(found, e, ENDPOINT, 2000)
from relay.resource import CachedResource
print("from_encoded_many", t(lambda: CachedResource.from_encoded_many(ENDPOINT, names, versions, ent, 0.0)))
print("whole parse_response", t(lambda: parse_response(resp)))
from google.protobuf.internal import api_implementation
print("backend", api_implementation.Type())
from envoy.config.endpoint.v3 import endpoint_pb2
bodies = [r.resource.value for r in resp.resources]
print("body sample len", len(bodies[0]))
cla = endpoint_pb2.ClusterLoadAssignment.FromString(bodies[0])
print(str(cla)[:600])
print("each FromString", t(lambda: [endpoint_pb2.ClusterLoadAssignment.FromString(b) for b in bodies]))
big = found.checked.FromString(j)
print("checked obj del", t(lambda: found.checked.FromString(j)))
