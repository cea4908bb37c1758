#!/bin/bash
# the collector's young threshold: t5 (10,000) against t4 (50,000, as shipped); benchmarks from t6
cd /tmp/t6
echo "== reconnect e2e 50000 $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
timeout 1500 .venv/bin/python -m benchmarks.reconnect --clients 600 --resources 50000 --rounds 3 \
  --outages 0 --relay-src /tmp/t4 --relay-src /tmp/t5 --repeat 2 --out /tmp/scr/e2e-gc.json 2>&1 | grep -v '^$' | tail -10
for tree in t4 t5 t4 t5; do
  echo "== reconnect_steps changed 1 tree $tree $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  timeout 600 .venv/bin/python -m benchmarks.reconnect_steps --resources 50000 --size 1260 \
    --changed 1 --runs 5 --relay-src /tmp/$tree | tail -1
done
echo "== fanout $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
timeout 1800 .venv/bin/python -m benchmarks.fanout --streams 1000 --runs 3 \
  --servers bare-default,relay,relay-before --relay-src /tmp/t5 --before-src /tmp/t4 \
  --out /tmp/scr/fanout-gc.json 2>&1 | grep "^|"
echo "== done gc part $(date +%T)"
echo "== fanout again, the final code against base19 $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
timeout 1800 .venv/bin/python -m benchmarks.fanout --streams 1000 --runs 3 \
  --servers bare-default,relay,relay-before --relay-src /tmp/t4 --before-src /tmp/base19 \
  --out /tmp/scr/fanout2.json 2>&1 | grep "^|"
echo "== done again $(date +%T)"
