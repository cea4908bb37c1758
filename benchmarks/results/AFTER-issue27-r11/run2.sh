#!/bin/bash
# in process: c1 (slices of ~1 MiB, 16 MiB trim) against base (20a1fd2), both orders
cd /tmp/c1
for args in "--cold --size 1024" "--size 1024" "--cold --size 300" "--size 300"; do
  for pair in "c1 base" "base c1"; do
    set -- $pair
    echo "== warm_sections $args relay $1 baseline $2 $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    timeout 900 .venv/bin/python -m benchmarks.warm_sections $args --runs 6 --relay-src /tmp/$1 --baseline-src /tmp/$2 2>&1 | tail -17
  done
done
for tree in c1 base; do
  for ph in delta-names sotw-names refused-nodes idle-streams; do
    echo "== memory $ph $tree $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    timeout 600 .venv/bin/python -m benchmarks.memory --only $ph --relay-src /tmp/$tree 2>&1 | grep "^| $ph"
  done
done
