#!/bin/bash
# Final before/after measurements of issue 27 (fifth round), quiet machine, back to back.
cd /work/main; mkdir -p /tmp/final35
B=/work/base-bbf04eb
O=/tmp/final35
P=.venv/bin/python
run() { local name=$1; shift; echo "== $name: $* (load $(cut -d' ' -f1 /proc/loadavg), $(date +%T))" | tee -a $O/index.txt; "$@" > $O/$name.log 2>&1; tail -60 $O/$name.log | grep -E "^\|" > $O/$name.md; }
run bc300-before $P -m benchmarks.big_client --resources 10000 --size 300 --runs 3 --servers bare,relay,forwarder --max-response-size default,2GiB --relay-src $B --out $O/bc300-before.json
run bc300-after  $P -m benchmarks.big_client --resources 10000 --size 300 --runs 3 --servers bare,relay,forwarder --max-response-size default,2GiB --out $O/bc300-after.json
run sotw300-before $P -m benchmarks.big_client --resources 10000 --size 300 --runs 3 --servers bare,relay --variant sotw --relay-src $B --out $O/sotw300-before.json
run sotw300-after  $P -m benchmarks.big_client --resources 10000 --size 300 --runs 3 --servers bare,relay --variant sotw --out $O/sotw300-after.json
run bc1k-before $P -m benchmarks.big_client --resources 10000 --size 1024 --runs 3 --servers bare,relay --relay-src $B --out $O/bc1k-before.json
run bc1k-after  $P -m benchmarks.big_client --resources 10000 --size 1024 --runs 3 --servers bare,relay --out $O/bc1k-after.json
run fanout $P -m benchmarks.fanout --streams 1000,2000 --runs 3 --servers bare,bare-default,relay,relay-before --before-src $B --out $O/fanout.json
run workers-before $P -m benchmarks.workers --workers 1,2 --runs 3 --relay-src $B --out $O/workers-before.json
run workers-after  $P -m benchmarks.workers --workers 1,2 --runs 3 --out $O/workers-after.json
run tls $P -m benchmarks.tls --modes bare-tls,bare-tls-default,tls --streams 1000,2000 --runs 3 --out $O/tls.json
run warm-sections $P -m benchmarks.warm_sections --size 300 --runs 4 --baseline-src $B
echo done >> $O/index.txt
#!/bin/bash
# Second pass: pairs that read worse than the noise in the first (workers, TLS, storm), and the 300 B pair again.
cd /work/main; O=/tmp/final35; B=/work/base-bbf04eb; P=.venv/bin/python
run() { local name=$1; shift; echo "== $name: $* (load $(cut -d' ' -f1 /proc/loadavg), $(date +%T))" | tee -a $O/index.txt; "$@" > $O/$name.log 2>&1; tail -60 $O/$name.log | grep -E "^\|" > $O/$name.md; }
run workers-after-2  $P -m benchmarks.workers --workers 1,2 --runs 3 --out $O/workers-after-2.json
run workers-before-2 $P -m benchmarks.workers --workers 1,2 --runs 3 --relay-src $B --out $O/workers-before-2.json
run tls-pair $P -m benchmarks.tls --modes bare-tls-default,tls,tls-before --before-src $B --streams 1000 --runs 3 --out $O/tls-pair.json
run fanout-1000-again $P -m benchmarks.fanout --streams 1000 --runs 3 --servers bare-default,relay,relay-before --before-src $B --out $O/fanout-1000-again.json
run bc300-after-2  $P -m benchmarks.big_client --resources 10000 --size 300 --runs 3 --servers bare,relay,forwarder --out $O/bc300-after-2.json
run bc300-before-2 $P -m benchmarks.big_client --resources 10000 --size 300 --runs 3 --servers bare,relay,forwarder --relay-src $B --out $O/bc300-before-2.json
echo done2 >> $O/index.txt
# Then, by hand: the storm in the other order, five runs of the two relays, and the in-process storm.
$P -m benchmarks.fanout --streams 1000 --runs 3 --servers bare-default,relay-before,relay --before-src $B --out $O/fanout-1000-reversed.json
$P -m benchmarks.fanout --streams 1000 --runs 5 --servers relay,relay-before --before-src $B --out $O/fanout-1000-runs5.json
$P -m benchmarks.warm_sections --size 300 --runs 6 --baseline-src $B   # warm-sections-2.md
$P -m benchmarks.storm_steps --runs 12 --baseline-src $B              # storm-steps.md
run bc300-before-3 $P -m benchmarks.big_client --resources 10000 --size 300 --runs 5 --servers bare,relay,forwarder --relay-src $B --out $O/bc300-before-3.json
run bc300-after-3  $P -m benchmarks.big_client --resources 10000 --size 300 --runs 5 --servers bare,relay,forwarder --out $O/bc300-after-3.json
