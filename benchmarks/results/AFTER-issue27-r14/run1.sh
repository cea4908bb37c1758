# issue 27, fourteenth round: base 19106bd (/tmp/base19) against new (/tmp/t1), a b a b
cd /tmp/t1
for changed in 0 1; do
  for tree in base19 t1 base19 t1; do
    echo "== reconnect_steps changed $changed tree $tree $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    .venv/bin/python -m benchmarks.reconnect_steps --resources 50000 --size 1260 --changed $changed --runs 5 --relay-src /tmp/$tree | tail -1
  done
done
echo "== reconnect e2e $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
.venv/bin/python -m benchmarks.reconnect --clients 200 --resources 10000 --rounds 4 --outages 0 --relay-src /tmp/base19 --relay-src /tmp/t1 --repeat 2 --out /tmp/scr/reconnect.json 2>&1 | tail -12
echo "== done $(date +%T)"
