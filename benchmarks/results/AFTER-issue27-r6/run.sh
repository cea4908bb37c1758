#!/bin/bash
# Final before/after measurements of issue 27 (sixth round: the cold join), back to back.
cd /work/main; mkdir -p /tmp/final36
B=${BEFORE:?an export of bfe2ff7}
O=/tmp/final36
P=.venv/bin/python
run() { local name=$1; shift; echo "== $name: $* (load $(cut -d' ' -f1 /proc/loadavg), $(date +%T))" | tee -a $O/index.txt; "$@" > $O/$name.log 2>&1; tail -60 $O/$name.log | grep -E "^\|" > $O/$name.md; }
run cold-sections $P -m benchmarks.warm_sections --cold --runs 8 --baseline-src $B
run cold-path-2000 $P -m benchmarks.cold_path --runs 9 --per-response 2000
run cold-path-2000-before $P -m benchmarks.cold_path --runs 9 --per-response 2000 --relay-src $B
run bc300-before $P -m benchmarks.big_client --resources 10000 --size 300 --runs 5 --servers bare,relay,forwarder --max-response-size default,2GiB --relay-src $B --out $O/bc300-before.json
run bc300-after  $P -m benchmarks.big_client --resources 10000 --size 300 --runs 5 --servers bare,relay,forwarder --max-response-size default,2GiB --out $O/bc300-after.json
run warm-sections $P -m benchmarks.warm_sections --size 300 --runs 6 --baseline-src $B
run bc1k-after  $P -m benchmarks.big_client --resources 10000 --size 1024 --runs 3 --servers bare,relay,forwarder --out $O/bc1k-after.json
run bc1k-before $P -m benchmarks.big_client --resources 10000 --size 1024 --runs 3 --servers bare,relay,forwarder --relay-src $B --out $O/bc1k-before.json
run sotw300-before $P -m benchmarks.big_client --resources 10000 --size 300 --runs 3 --servers bare,relay --variant sotw --relay-src $B --out $O/sotw300-before.json
run sotw300-after  $P -m benchmarks.big_client --resources 10000 --size 300 --runs 3 --servers bare,relay --variant sotw --out $O/sotw300-after.json
run fanout $P -m benchmarks.fanout --streams 1000,2000 --runs 3 --servers bare,bare-default,relay,relay-before --before-src $B --out $O/fanout.json
run storm-steps $P -m benchmarks.storm_steps --runs 12 --baseline-src $B
run workers-before $P -m benchmarks.workers --workers 1,2 --runs 3 --relay-src $B --out $O/workers-before.json
run workers-after  $P -m benchmarks.workers --workers 1,2 --runs 3 --out $O/workers-after.json
run tls $P -m benchmarks.tls --modes bare-tls-default,tls,tls-before --before-src $B --streams 1000 --runs 3 --out $O/tls.json
run memory-before $P -m benchmarks.memory --only delta-names --relay-src $B
run memory-after  $P -m benchmarks.memory --only delta-names
echo done >> $O/index.txt
#!/bin/bash
# Second pass, at the final commit (the pipelining reverted): the cold pairs again.
cd /work/main; O=/tmp/final36; B=$BEFORE; P=.venv/bin/python
run() { local name=$1; shift; echo "== $name: $* (load $(cut -d' ' -f1 /proc/loadavg), $(date +%T))" | tee -a $O/index.txt; "$@" > $O/$name.log 2>&1; tail -60 $O/$name.log | grep -E "^\|" > $O/$name.md; }
run bc300-after-2  $P -m benchmarks.big_client --resources 10000 --size 300 --runs 5 --servers bare,relay,forwarder --max-response-size default,2GiB --out $O/bc300-after-2.json
run bc300-before-2 $P -m benchmarks.big_client --resources 10000 --size 300 --runs 5 --servers bare,relay,forwarder --max-response-size default,2GiB --relay-src $B --out $O/bc300-before-2.json
run cold-sections-2 $P -m benchmarks.warm_sections --cold --runs 8 --baseline-src $B
run bc1k-before-2 $P -m benchmarks.big_client --resources 10000 --size 1024 --runs 3 --servers bare,relay,forwarder --relay-src $B --out $O/bc1k-before-2.json
run bc1k-after-2  $P -m benchmarks.big_client --resources 10000 --size 1024 --runs 3 --servers bare,relay,forwarder --out $O/bc1k-after-2.json
echo done2 >> $O/index.txt
# then, at the final commit: .venv/bin/python -m benchmarks.fanout --streams 1000 --runs 3 --servers bare-default,relay,relay-before --before-src $B --out $O/fanout-1000-again.json
