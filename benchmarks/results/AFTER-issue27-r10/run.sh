#!/bin/sh
# Issue 27, tenth round: 96a23f5 (BEFORE) against ad034ef (AFTER), run from an
# export of ad034ef with both trees exported beside it. Each command's output is
# in <name>.log; index.txt says when each ran, and the load.
set -u
OUT=benchmarks/results/AFTER-issue27-r10
PY=.venv/bin/python
run() { name=$1; shift; echo "== $name: $* (load $(cut -d' ' -f1 /proc/loadavg), $(date +%H:%M:%S))" >> $OUT/index.txt; "$@" > $OUT/$name.log 2>&1; }
run sections-cold-after-first $PY -m benchmarks.warm_sections --cold --runs 8 --relay-src $AFTER --baseline-src $BEFORE
run sections-cold-before-first $PY -m benchmarks.warm_sections --cold --runs 8 --relay-src $BEFORE --baseline-src $AFTER
for i in 1 2; do
  run big_client-after-$i $PY -m benchmarks.big_client --resources 10000 --size 300 --runs 5 --servers bare,relay,forwarder --relay-src $AFTER
  run big_client-before-$i $PY -m benchmarks.big_client --resources 10000 --size 300 --runs 5 --servers bare,relay,forwarder --relay-src $BEFORE
done
run big_client-1k-before $PY -m benchmarks.big_client --resources 10000 --size 1024 --runs 5 --servers bare,relay,forwarder --relay-src $BEFORE
run big_client-1k-after $PY -m benchmarks.big_client --resources 10000 --size 1024 --runs 5 --servers bare,relay,forwarder --relay-src $AFTER
run sections-warm-after-first $PY -m benchmarks.warm_sections --runs 8 --relay-src $AFTER --baseline-src $BEFORE
run sections-warm-before-first $PY -m benchmarks.warm_sections --runs 8 --relay-src $BEFORE --baseline-src $AFTER
for i in 1 2; do
  run cold_path-before-$i $PY -m benchmarks.cold_path --runs 9 --per-response 2000 --relay-src $BEFORE
  run cold_path-after-$i $PY -m benchmarks.cold_path --runs 9 --per-response 2000 --relay-src $AFTER
done
for phase in refused-nodes delta-names sotw-names idle-streams; do
  run memory-$phase-before $PY -m benchmarks.memory --only $phase --relay-src $BEFORE
  run memory-$phase-after $PY -m benchmarks.memory --only $phase --relay-src $AFTER
done
run fanout $PY -m benchmarks.fanout --streams 1000,2000 --runs 3 --servers bare,bare-default,relay,relay-before --relay-src $AFTER --before-src $BEFORE
run storm_steps $PY -m benchmarks.storm_steps --runs 12 --relay-src $AFTER --baseline-src $BEFORE
run tls $PY -m benchmarks.tls --modes bare-tls-default,tls,tls-before --relay-src $AFTER --before-src $BEFORE --streams 1000 --runs 3 --out $OUT/tls.json
run workers-after $PY -m benchmarks.workers --workers 1,2 --runs 3 --relay-src $AFTER --out $OUT/workers-after.json
run workers-before $PY -m benchmarks.workers --workers 1,2 --runs 3 --relay-src $BEFORE --out $OUT/workers-before.json
