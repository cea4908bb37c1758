#!/bin/bash
# end to end, big clients: a (9cf05d9) against b (21e5f5a), back to back
cd /tmp/a
for size in 1024 300; do
  for tree in a b a b; do
    echo "== big_client size $size tree $tree $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    timeout 900 .venv/bin/python -m benchmarks.big_client --resources 10000 --size $size --runs 5 \
      --servers bare,relay,forwarder --relay-src /tmp/$tree 2>&1 | grep "^|"
  done
done
echo "== done $(date +%T)"
