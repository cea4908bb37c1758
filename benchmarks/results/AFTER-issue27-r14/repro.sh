cd /tmp/t3
for i in 1 2 3 4 5 6; do
  for tree in t3 base19; do
    echo "== run $i tree $tree $(date +%T)"
    timeout 600 .venv/bin/python -m benchmarks.reconnect --clients 600 --resources 50000 --rounds 3 --outages 0 --relay-src /tmp/$tree --out /tmp/scr/r.json 2>&1 | grep -E '^\{"resend"|^LOG'
  done
done
echo "== done $(date +%T)"
