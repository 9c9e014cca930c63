#!/bin/bash
# A longer fine-tune of the pair shipped on 2026-12-05: the block drafter's run resumed for 10 more minutes on the
# same store (it stopped at half its schedule), then treeflash's module fine-tuned from the shipped one on it.
# Usage: bash run2.sh train | heldout
set -e
D=benchmarks/2026-12-04-task-selfdistill
CK=src/blockdraft/checkpoints/smollm2-135m
W=runs/task2
case $1 in
train)
  cp -r runs/task/dflash $W/dflash   # the shipped dflash's run, with its resume state
  blockdraft train --resume $W/dflash --max-minutes 20
  blockdraft train --data runs/task/mix.jsonl --store runs/store-task --max-tokens 1200000 --lr 3e-4 --epochs 2 \
    --threads 2 --drafter treeflash --init $W/dflash --init-module $CK/treeflash --max-minutes 10 --out $W/treeflash
  ;;
heldout)
  M=ar,dflash,dflash:checkpoint=$W/dflash,treeflash:budget=32,treeflash:budget=32:checkpoint=$W/dflash:module=$W/treeflash
  blockdraft bench --questions sharegpt --per-category 60 --max-new-tokens 128 --threads 2 --no-compile --methods $M \
    --out $D/run2-heldout60
  blockdraft bench --questions $D/heldout_tasks.jsonl --max-new-tokens 128 --threads 2 --no-compile --methods $M \
    --out $D/run2-heldout-tasks
  ;;
esac
