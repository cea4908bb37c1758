#!/bin/bash
# in process: a (9cf05d9, responses read as received) against b (21e5f5a), back to back
cd /tmp/a
for args in "--resources 10000 --size 1024 --per-response 2000" "--resources 10000 --size 300 --per-response 2000" \
            "--resources 2000 --size 13000 --per-response 2000" "--resources 50000 --size 1260 --no-versions" \
            "--resources 50000 --size 1260"; do
  for tree in a b a b; do
    echo "== cold_path $args tree $tree $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    timeout 900 .venv/bin/python -m benchmarks.cold_path $args --runs 5 --relay-src /tmp/$tree 2>&1 | tail -1
  done
done
for args in "--cold --size 1024" "--cold --size 300" "--size 1024"; do
  for pair in "a b" "b a"; do
    set -- $pair
    echo "== warm_sections $args relay $1 baseline $2 $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    timeout 900 .venv/bin/python -m benchmarks.warm_sections $args --runs 6 --relay-src /tmp/$1 --baseline-src /tmp/$2 2>&1 | tail -17
  done
done
echo "== done $(date +%T)"
