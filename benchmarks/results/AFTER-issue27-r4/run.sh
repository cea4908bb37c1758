#!/bin/bash
# Final before/after measurements of issue 27 (fourth round), quiet machine, back to back.
cd "$(git rev-parse --show-toplevel)"; O=${O:-/tmp/final34}; mkdir -p $O
B=${B:?an export of 7a4814c (git archive 7a4814c | tar -x -C DIR)}
P=.venv/bin/python
run() { local name=$1; shift; echo "== $name: $* (load $(cut -d' ' -f1 /proc/loadavg), $(date +%T))" | tee -a $O/index.txt; "$@" > $O/$name.log 2>&1; tail -60 $O/$name.log | grep -E "^\|" > $O/$name.md; }
run bc300-before $P -m benchmarks.big_client --resources 10000 --size 300 --runs 3 --servers bare,relay,forwarder --max-response-size default,2GiB --relay-src $B --out $O/bc300-before.json
run bc300-after  $P -m benchmarks.big_client --resources 10000 --size 300 --runs 3 --servers bare,relay,forwarder --max-response-size default,2GiB --out $O/bc300-after.json
run bc1k-before $P -m benchmarks.big_client --resources 10000 --size 1024 --runs 3 --servers bare,relay --relay-src $B --out $O/bc1k-before.json
run bc1k-after  $P -m benchmarks.big_client --resources 10000 --size 1024 --runs 3 --servers bare,relay --out $O/bc1k-after.json
run fanout $P -m benchmarks.fanout --streams 1000,2000 --runs 3 --servers bare,bare-default,relay,relay-before --before-src $B --out $O/fanout.json
run workers-before $P -m benchmarks.workers --workers 1,2 --runs 3 --relay-src $B --out $O/workers-before.json
run workers-after  $P -m benchmarks.workers --workers 1,2 --runs 3 --out $O/workers-after.json
run tls $P -m benchmarks.tls --modes bare-tls,bare-tls-default,tls --streams 1000,2000 --runs 3 --out $O/tls.json
run fanout-storm $P -m benchmarks.fanout --streams 1000 --runs 3 --servers bare-default,relay,relay-before --before-src $B --out $O/fanout-storm.json  # (the storm pair again, at once)
echo done >> $O/index.txt
