#!/bin/bash
# TLS and workers, after (adf2a9c, /tmp/a2) against before (20a1fd2, /tmp/base)
cd /tmp/a2
echo "== tls $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
timeout 1200 .venv/bin/python -m benchmarks.tls --modes bare-tls-default,tls,tls-before --relay-src /tmp/a2 --before-src /tmp/base --streams 1000 --runs 3 --out /tmp/r11/tls.json 2>&1 | grep "^|"
for tree in a2 base; do
  echo "== workers $tree $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  timeout 1200 .venv/bin/python -m benchmarks.workers --workers 1,2 --runs 3 --relay-src /tmp/$tree --out /tmp/r11/workers-$tree.json 2>&1 | grep "^|"
done
echo "== done $(date +%T)"
