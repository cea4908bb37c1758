#!/bin/bash
# the collector's young threshold: t5 (10,000) against t4 (50,000), big_client 10,000 x 1 KB, twice
cd /tmp/t6
for tree in t5 t4 t5 t4; do
  echo "== big_client size 1024 tree $tree $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  timeout 900 .venv/bin/python -m benchmarks.big_client --resources 10000 --size 1024 --runs 5 \
    --servers bare,relay,forwarder --relay-src /tmp/$tree --out /tmp/scr/big-gc.json 2>&1 | grep "^|"
done
echo "== done $(date +%T)"
