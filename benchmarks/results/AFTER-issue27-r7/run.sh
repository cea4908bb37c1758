#!/bin/bash
# Final before/after measurements of issue 27 (seventh round), back to back, run from an export of
# the final commit (AFTER) with the session's start (BEFORE) through --relay-src/--before-src/--baseline-src.
A=${AFTER:?an export of the final commit}; B=${BEFORE:?an export of fccfd97}
cd $A; O=/tmp/final37; mkdir -p $O; P=.venv/bin/python
run() { local name=$1; shift; echo "== $name: $* (load $(cut -d' ' -f1 /proc/loadavg), $(date +%T))" | tee -a $O/index.txt; "$@" > $O/$name.log 2>&1; tail -60 $O/$name.log | grep -E "^\|" > $O/$name.md; }
run cold-sections $P -m benchmarks.warm_sections --cold --runs 8 --baseline-src $B
run bc300-before $P -m benchmarks.big_client --resources 10000 --size 300 --runs 5 --servers bare,relay,forwarder --max-response-size default,2GiB --relay-src $B --out $O/bc300-before.json
run bc300-after  $P -m benchmarks.big_client --resources 10000 --size 300 --runs 5 --servers bare,relay,forwarder --max-response-size default,2GiB --out $O/bc300-after.json
run bc300-after-2  $P -m benchmarks.big_client --resources 10000 --size 300 --runs 5 --servers relay,forwarder --out $O/bc300-after-2.json
run bc300-before-2 $P -m benchmarks.big_client --resources 10000 --size 300 --runs 5 --servers relay,forwarder --relay-src $B --out $O/bc300-before-2.json
run sotw300-before $P -m benchmarks.big_client --resources 10000 --size 300 --runs 3 --servers bare,relay --variant sotw --relay-src $B --out $O/sotw300-before.json
run sotw300-after  $P -m benchmarks.big_client --resources 10000 --size 300 --runs 3 --servers bare,relay --variant sotw --out $O/sotw300-after.json
run reconnect $P -m benchmarks.reconnect --clients 200 --resources 10000 --rounds 4 --outages 0 --relay-src $B --relay-src $A --repeat 2 --out $O/reconnect.json
run warm-sections $P -m benchmarks.warm_sections --size 300 --runs 6 --baseline-src $B
run bc1k-after  $P -m benchmarks.big_client --resources 10000 --size 1024 --runs 3 --servers bare,relay,forwarder --out $O/bc1k-after.json
run bc1k-before $P -m benchmarks.big_client --resources 10000 --size 1024 --runs 3 --servers bare,relay,forwarder --relay-src $B --out $O/bc1k-before.json
run fanout $P -m benchmarks.fanout --streams 1000,2000 --runs 3 --servers bare,bare-default,relay,relay-before --before-src $B --out $O/fanout.json
run storm-steps $P -m benchmarks.storm_steps --runs 12 --baseline-src $B
run workers-before $P -m benchmarks.workers --workers 1,2 --runs 3 --relay-src $B --out $O/workers-before.json
run workers-after  $P -m benchmarks.workers --workers 1,2 --runs 3 --out $O/workers-after.json
run memory-before $P -m benchmarks.memory --only delta-names --relay-src $B
run memory-after  $P -m benchmarks.memory --only delta-names
echo done >> $O/index.txt
