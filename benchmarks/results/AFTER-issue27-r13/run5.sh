#!/bin/bash
# the final tree (new4, 185a35d: the resend applied in steps too) against base (2499855):
# reconnect steps in process, a b a b; then fan-out at 1,000 streams
cd /tmp/new4
for changed in 0 1; do
  for tree in base new4 base new4; do
    echo "== reconnect_steps changed $changed tree $tree $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    .venv/bin/python -m benchmarks.reconnect_steps --resources 50000 --size 1260 --changed $changed --runs 5 --relay-src /tmp/$tree | tail -1
  done
done
echo "== fanout $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
timeout 1800 .venv/bin/python -m benchmarks.fanout --streams 1000 --runs 3 \
  --servers bare,bare-default,relay,relay-before --relay-src /tmp/new4 --before-src /tmp/base 2>&1 | grep -E "^\||rror"
echo "== done $(date +%T)"
