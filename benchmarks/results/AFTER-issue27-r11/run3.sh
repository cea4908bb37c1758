#!/bin/bash
# end to end, before (20a1fd2, /tmp/base) and after (adf2a9c, /tmp/a2), back to back
cd /tmp/a2
for size in 1024 300; do
  for tree in a2 base a2 base; do
    echo "== big_client size $size tree $tree $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    timeout 900 .venv/bin/python -m benchmarks.big_client --resources 10000 --size $size --runs 5 \
      --servers bare,relay,forwarder --relay-src /tmp/$tree 2>&1 | grep "^|"
  done
done
echo "== fanout $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
timeout 1800 .venv/bin/python -m benchmarks.fanout --streams 1000,2000 --runs 3 \
  --servers bare,bare-default,relay,relay-before --relay-src /tmp/a2 --before-src /tmp/base 2>&1 | grep "^|"
echo "== storm_steps $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
timeout 1200 .venv/bin/python -m benchmarks.storm_steps --runs 12 --relay-src /tmp/a2 --baseline-src /tmp/base 2>&1 | grep "^|"
echo "== done $(date +%T)"
