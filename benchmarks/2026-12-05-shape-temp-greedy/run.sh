#!/bin/bash
# Deterministic (greedy) trees shaped from the drafter's log-probs sharpened or flattened to shape_temp
# (1 = as today). The option was temporary: apply shape_temp_greedy.diff first (`git apply` from the repository
# root; it is 2026-12-04-shape-temp/shape_temp.diff for deterministic trees too). Usage: bash run.sh heldout | quick
set -e
D=benchmarks/2026-12-05-shape-temp-greedy
M=ar
for S in 1 0.5 0.7 1.4; do M=$M,treeflash:budget=32:shape_temp=$S,hydra:shape_temp=$S; done
case $1 in
heldout)
  blockdraft bench --questions sharegpt --per-category 20 --max-new-tokens 128 --threads 2 --no-compile \
    --methods $M --out $D/heldout
  ;;
quick)
  blockdraft bench --per-category 2 --max-new-tokens 128 --threads 2 --no-compile --methods $M --out $D/quick
  ;;
esac
