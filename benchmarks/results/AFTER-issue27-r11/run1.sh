#!/bin/bash
# big_client cold/warm, before (20a1fd2) and after (5e0dccf), back to back
cd /tmp/a1
for size in 1024 300; do
  for tree in base a1 a1 base; do
    echo "== size $size tree $tree $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    timeout 900 .venv/bin/python -m benchmarks.big_client --resources 10000 --size $size --runs 5 \
      --servers bare,relay,forwarder --relay-src /tmp/$tree 2>&1 | tail -40
  done
done
