#!/bin/bash
# Fine-tune the block drafter, then TreeFlash's AR module on it, on the target's own replies.
set -e
source /work/venv/bin/activate
cd /work/main
D=runs/sd/sharegpt-smollm2-sd.jsonl
CK=src/blockdraft/checkpoints/smollm2-135m
blockdraft train --drafter block --data $D --store runs/store-sd --max-tokens 2000000 --init $CK/dflash \
  --lr 3e-4 --epochs 2 --max-minutes 10 --threads 2 --out runs/dflash-sd > runs/dflash-sd.log 2>&1
blockdraft train --drafter treeflash --data $D --store runs/store-sd --max-tokens 2000000 --init runs/dflash-sd \
  --init-module $CK/treeflash --lr 3e-4 --epochs 2 --max-minutes 8 --threads 2 --out runs/treeflash-sd > runs/treeflash-sd.log 2>&1
