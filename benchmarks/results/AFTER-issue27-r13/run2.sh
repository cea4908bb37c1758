#!/bin/bash
# reconnect steps in process, 50,000 x 1,260 B: before (base, 2499855) and after (new2), a b a b
cd /tmp/new2
for changed in 0 1; do
  for tree in base new2 base new2; do
    .venv/bin/python -m benchmarks.reconnect_steps --resources 50000 --size 1260 --changed $changed --runs 5 --relay-src /tmp/$tree
  done
done
