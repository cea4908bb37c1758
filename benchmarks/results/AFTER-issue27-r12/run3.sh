#!/bin/bash
# again, machine calmer: fan-out at 1,000, storm steps, TLS; a (9cf05d9) against b (21e5f5a)
cd /tmp/a
echo "== fanout 1000 $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
timeout 1200 .venv/bin/python -m benchmarks.fanout --streams 1000 --runs 3 \
  --servers bare,bare-default,relay,relay-before --relay-src /tmp/a --before-src /tmp/b 2>&1 | grep "^|"
echo "== storm_steps $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
timeout 1200 .venv/bin/python -m benchmarks.storm_steps --runs 12 --relay-src /tmp/a --baseline-src /tmp/b 2>&1 | grep "^|"
echo "== tls $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
timeout 1200 .venv/bin/python -m benchmarks.tls --modes bare-tls-default,tls,tls-before --relay-src /tmp/a --before-src /tmp/b --streams 1000 --runs 3 --out /tmp/r12/tls.json 2>&1 | grep "^|"
echo "== done $(date +%T)"
