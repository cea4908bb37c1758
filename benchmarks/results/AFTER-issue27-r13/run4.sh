#!/bin/bash
# final tree (new3) against base (2499855): fan-out at 1,000 streams, then reconnect steps in process
cd /tmp/new3
echo "== fanout $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
timeout 1800 .venv/bin/python -m benchmarks.fanout --streams 1000 --runs 3 \
  --servers bare,bare-default,relay,relay-before --relay-src /tmp/new3 --before-src /tmp/base 2>&1 | grep -E "^\||rror"
for changed in 0 1; do
  for tree in base new3 base new3; do
    echo "== reconnect_steps changed $changed tree $tree $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    .venv/bin/python -m benchmarks.reconnect_steps --resources 50000 --size 1260 --changed $changed --runs 5 --relay-src /tmp/$tree | tail -1
  done
done
echo "== done $(date +%T)"
