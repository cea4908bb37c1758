#!/bin/bash
# Final before/after measurements of issue 27 (third round), quiet machine, back to back.
cd /work/main
B=/work/base-9d39381
O=/tmp/final33
P=.venv/bin/python
run() { local name=$1; shift; echo "== $name: $* (load $(cut -d' ' -f1 /proc/loadavg), $(date +%T))" | tee -a $O/index.txt; "$@" > $O/$name.log 2>&1; tail -60 $O/$name.log | grep -E "^\|" > $O/$name.md; }
run bc300-before $P -m benchmarks.big_client --resources 10000 --size 300 --runs 3 --servers bare,relay,forwarder --relay-src $B --out $O/bc300-before.json
run bc300-after  $P -m benchmarks.big_client --resources 10000 --size 300 --runs 3 --servers bare,relay,forwarder --out $O/bc300-after.json
run bc1k-before $P -m benchmarks.big_client --resources 10000 --size 1024 --runs 3 --servers bare,relay --relay-src $B --out $O/bc1k-before.json
run bc1k-after  $P -m benchmarks.big_client --resources 10000 --size 1024 --runs 3 --servers bare,relay --out $O/bc1k-after.json
run sotw-before $P -m benchmarks.big_client --resources 10000 --size 300 --runs 3 --servers bare,relay --variant sotw --relay-src $B --out $O/sotw-before.json
run sotw-after  $P -m benchmarks.big_client --resources 10000 --size 300 --runs 3 --servers bare,relay --variant sotw --out $O/sotw-after.json
run rest-before $P -m benchmarks.rest --runs 5 --polls 30 --relay-src $B
run rest-after  $P -m benchmarks.rest --runs 5 --polls 30
run fanout $P -m benchmarks.fanout --streams 1000,2000 --runs 3 --servers bare,bare-default,relay,relay-no-window,relay-before --before-src $B --out $O/fanout.json
run workers-before $P -m benchmarks.workers --workers 1,2 --runs 3 --relay-src $B --out $O/workers-before.json
run workers-after  $P -m benchmarks.workers --workers 1,2 --runs 3 --out $O/workers-after.json
echo done >> $O/index.txt
