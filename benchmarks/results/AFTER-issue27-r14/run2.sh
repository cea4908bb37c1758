# base 19106bd (/tmp/base19) against 385b846+bench (/tmp/t2): --streams 4, changed 1 then 0
cd /tmp/t2
for changed in 1 0; do
  for tree in base19 t2 base19 t2; do
    echo "== reconnect_steps streams 4 changed $changed tree $tree $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    .venv/bin/python -m benchmarks.reconnect_steps --resources 50000 --size 1260 --changed $changed --runs 3 --streams 4 --relay-src /tmp/$tree | tail -1
  done
done
echo "== done $(date +%T)"
