#!/bin/bash
# Issue 27, eighth round: what was tried on the cold join and dropped, measured
# from exports (BASE = f8ea78f, where this round started; HELPER = BASE with
# decode-helper.patch applied; TURN = BASE with MAX_NAMES_PER_TURN = 10_000 in
# relay/upstream/client.py), run from BASE's tree, pairs back to back.
B=${BASE:?an export of f8ea78f}; H=${HELPER:?BASE + decode-helper.patch}; T=${TURN:?BASE, one turn of 10,000}
R=$(dirname "$(readlink -f "$0")"); cd $B; P=.venv/bin/python
run() { local name=$1; shift; echo "== $name: $* (load $(cut -d' ' -f1 /proc/loadavg), $(date +%T))" | tee -a $R/index.txt; "$@" > $R/$name.log 2>&1; }
run big_client-f8ea78f $P -m benchmarks.big_client --resources 10000 --size 300 --runs 5 --servers bare,relay,forwarder
run big_client-1k-f8ea78f $P -m benchmarks.big_client --resources 10000 --size 1024 --runs 5 --servers bare,relay,forwarder
for round in 1 2; do
  run helper-$round $P -m benchmarks.big_client --resources 10000 --size 300 --runs 5 --servers relay,forwarder --relay-src $H
  run base-$round $P -m benchmarks.big_client --resources 10000 --size 300 --runs 5 --servers relay,forwarder --relay-src $B
done
run turn-sections $P -m benchmarks.warm_sections --cold --runs 6 --relay-src $T --baseline-src $B
run parse-stages sh -c "for i in 1 2 3; do $P $R/parse_stages.py $B; done"
# At the end of the round (FINAL = an export of the last commit), nothing got worse:
F=${FINAL:-}; if [ -n "$F" ]; then cd $F; P=.venv/bin/python
  run fanout-final-vs-f8ea78f $P -m benchmarks.fanout --streams 1000 --runs 3 --servers bare-default,relay,relay-before --before-src $B
  run sections-final-vs-f8ea78f sh -c "$P -m benchmarks.warm_sections --runs 6 --baseline-src $B; $P -m benchmarks.warm_sections --cold --runs 6 --baseline-src $B; $P -m benchmarks.warm_sections --cold --runs 8 --baseline-src $B; cd $B && $P -m benchmarks.warm_sections --cold --runs 8 --relay-src $B --baseline-src $F"
fi
