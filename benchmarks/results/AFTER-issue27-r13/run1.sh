#!/bin/bash
# reconnect steps in process, 50,000 x 1,260 B, trees before (base) and after (new), a b a b
cd /tmp/new
for changed in 0 1; do
  for tree in base new base new; do
    .venv/bin/python -m benchmarks.reconnect_steps --resources 50000 --size 1260 --changed $changed --runs 5 --relay-src /tmp/$tree
  done
done
