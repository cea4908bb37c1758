#!/bin/bash
# end to end: new2 (after) against base (2499855, before), back to back
cd /tmp/new2
echo "== reconnect e2e $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
timeout 1200 .venv/bin/python -m benchmarks.reconnect --clients 200 --resources 10000 --rounds 4 \
  --outages 0 --relay-src /tmp/base --relay-src /tmp/new2 --repeat 2 2>&1 | grep -v "^$" | tail -30
for tree in new2 base new2 base; do
  echo "== big_client size 1024 tree $tree $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  timeout 900 .venv/bin/python -m benchmarks.big_client --resources 10000 --size 1024 --runs 5 \
    --servers bare,relay,forwarder --relay-src /tmp/$tree 2>&1 | grep "^|"
done
echo "== fanout $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
timeout 1800 .venv/bin/python -m benchmarks.fanout --streams 1000 --runs 3 \
  --servers bare,bare-default,relay,relay-before --relay-src /tmp/new2 --before-src /tmp/base 2>&1 | grep "^|"
echo "== done $(date +%T)"
