import sys, time, statistics
sys.path.insert(0, ".")
from benchmarks.cold_path import origin_responses, ENDPOINT
from envoy.service.discovery.v3 import discovery_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from relay.upstream import bulk
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
enc = origin_responses(2000, 300, 2000)[0]
found = bulk.shadows(ENDPOINT)
pl = found.entries.FromString(enc).resources
joined = b"".join(bulk._entry_prefix(len(p)) + p for p in pl)
F = descriptor_pb2.FieldDescriptorProto
f = descriptor_pb2.FileDescriptorProto(name="y/t.proto", package="yt", syntax="proto2")
f.dependency.append(endpoint_pb2.DESCRIPTOR.name)
def msg(name, fields):
    m = f.message_type.add(name=name)
    for fn, num, ty, lab, tn in fields:
        x = m.field.add(name=fn, number=num, type=ty, label=lab)
        if tn: x.type_name = tn
CLA = ".envoy.config.endpoint.v3.ClusterLoadAssignment"
msg("Body1", [("type_url", 1, F.TYPE_BYTES, F.LABEL_OPTIONAL, None), ("value", 2, F.TYPE_MESSAGE, F.LABEL_OPTIONAL, CLA)])
msg("R1", [("version", 1, F.TYPE_BYTES, F.LABEL_OPTIONAL, None), ("resource", 2, F.TYPE_MESSAGE, F.LABEL_OPTIONAL, ".yt.Body1"), ("name", 3, F.TYPE_BYTES, F.LABEL_OPTIONAL, None)])
msg("C1", [("resources", 2, F.TYPE_MESSAGE, F.LABEL_REPEATED, ".yt.R1")])
msg("Body2", [("value", 2, F.TYPE_MESSAGE, F.LABEL_OPTIONAL, CLA)])
msg("R2", [("resource", 2, F.TYPE_MESSAGE, F.LABEL_OPTIONAL, ".yt.Body2")])
msg("C2", [("resources", 2, F.TYPE_MESSAGE, F.LABEL_REPEATED, ".yt.R2")])
pool = descriptor_pool.Default(); pool.Add(f)
C1 = message_factory.GetMessageClass(pool.FindMessageTypeByName("yt.C1"))
C2 = message_factory.GetMessageClass(pool.FindMessageTypeByName("yt.C2"))
def t(fn, n=40):
    xs = []
    for _ in range(n):
        s = time.perf_counter(); fn(); xs.append((time.perf_counter() - s) * 1e3)
    return f"{min(xs):.2f}/{statistics.median(xs):.2f}"
for _ in range(2):
    print("Checked (now)", t(lambda: found.checked.FromString(joined)))
    print("all known, bytes", t(lambda: C1.FromString(joined)))
    print("names unknown", t(lambda: C2.FromString(joined)))
