#!/bin/bash
# end to end: a (9cf05d9) against b (21e5f5a), back to back
cd /tmp/a
for tree in a b; do
  echo "== big_client 2000 x 13000 tree $tree $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  timeout 900 .venv/bin/python -m benchmarks.big_client --resources 2000 --size 13000 --runs 3 \
    --servers bare,relay --relay-src /tmp/$tree 2>&1 | grep "^|"
done
for tree in a b; do
  for ph in delta-names sotw-names; do
    echo "== memory $ph $tree $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    timeout 600 .venv/bin/python -m benchmarks.memory --only $ph --relay-src /tmp/$tree 2>&1 | grep "^| $ph"
  done
done
echo "== fanout $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
timeout 1800 .venv/bin/python -m benchmarks.fanout --streams 1000,2000 --runs 3 \
  --servers bare,bare-default,relay,relay-before --relay-src /tmp/a --before-src /tmp/b 2>&1 | grep "^|"
echo "== storm_steps $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
timeout 1200 .venv/bin/python -m benchmarks.storm_steps --runs 12 --relay-src /tmp/a --baseline-src /tmp/b 2>&1 | grep "^|"
echo "== done $(date +%T)"
