#!/bin/sh
# Issue 27, ninth round, the final commit 9239926 against be0e0fc: what the
# resident-memory watch's removal changes (in process, memory), run from an
# export of 9239926.
set -u
OUT=benchmarks/results/AFTER-issue27-r9/final
PY=.venv/bin/python
mkdir -p $OUT
run() { name=$1; shift; echo "== $name: $* (load $(cut -d' ' -f1 /proc/loadavg), $(date +%H:%M:%S))" >> $OUT/index.txt; "$@" > $OUT/$name.log 2>&1; }
run sections-warm-after-first $PY -m benchmarks.warm_sections --runs 8 --relay-src $AFTER --baseline-src $BEFORE
run sections-warm-before-first $PY -m benchmarks.warm_sections --runs 8 --relay-src $BEFORE --baseline-src $AFTER
run sections-cold-after-first $PY -m benchmarks.warm_sections --cold --runs 8 --relay-src $AFTER --baseline-src $BEFORE
run sections-cold-before-first $PY -m benchmarks.warm_sections --cold --runs 8 --relay-src $BEFORE --baseline-src $AFTER
for phase in refused-nodes delta-names sotw-names; do
  run memory-$phase-after $PY -m benchmarks.memory --only $phase --relay-src $AFTER
done
