#!/bin/bash
# issue 27, fourteenth round, the final relay code: t4 (3a6c005) against base19 (19106bd)
cd /tmp/t4
for streams in 0 4; do
  for changed in 0 1; do
    for tree in base19 t4 base19 t4; do
      echo "== reconnect_steps streams $streams changed $changed tree $tree $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
      timeout 600 .venv/bin/python -m benchmarks.reconnect_steps --resources 50000 --size 1260 \
        --changed $changed --runs 5 --streams $streams --relay-src /tmp/$tree | tail -1
    done
  done
done
echo "== reconnect e2e 50000, idle $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
timeout 1200 .venv/bin/python -m benchmarks.reconnect --clients 600 --resources 50000 --rounds 3 \
  --outages 0 --relay-src /tmp/base19 --relay-src /tmp/t4 --repeat 2 --out /tmp/scr/e2e-idle.json 2>&1 | grep -v '^$' | tail -12
echo "== reconnect e2e 50000, one core kept busy $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
python3 -c "while True: pass" & BUSY=$!
timeout 1500 .venv/bin/python -m benchmarks.reconnect --clients 600 --resources 50000 --rounds 3 \
  --outages 0 --relay-src /tmp/base19 --relay-src /tmp/t4 --repeat 2 --out /tmp/scr/e2e-busy.json 2>&1 | grep -v '^$' | tail -12
kill $BUSY
echo "== fanout $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
timeout 1800 .venv/bin/python -m benchmarks.fanout --streams 1000 --runs 3 \
  --servers bare,bare-default,relay,relay-before --relay-src /tmp/t4 --before-src /tmp/base19 \
  --out /tmp/scr/fanout.json 2>&1 | grep "^|"
for tree in t4 base19 t4 base19; do
  echo "== big_client size 1024 tree $tree $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  timeout 900 .venv/bin/python -m benchmarks.big_client --resources 10000 --size 1024 --runs 5 \
    --servers bare,relay,forwarder --relay-src /tmp/$tree --out /tmp/scr/big.json 2>&1 | grep "^|"
done
echo "== done $(date +%T)"
