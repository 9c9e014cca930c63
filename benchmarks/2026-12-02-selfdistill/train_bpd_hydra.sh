#!/bin/bash
# Fine-tune bpd heads, then hydra's AR module on them, on the target's own replies (runs/sd/...jsonl).
set -e
source /work/venv/bin/activate
cd /work/main
D=runs/sd/sharegpt-smollm2-sd.jsonl
CK=src/blockdraft/checkpoints/smollm2-135m
blockdraft train --drafter heads --data $D --store runs/store-sd --max-tokens 2000000 --init $CK/bpd \
  --lr 3e-4 --epochs 2 --max-minutes 12 --threads 2 --out runs/bpd-sd > runs/bpd-sd.log 2>&1
blockdraft train --drafter treeflash --data $D --store runs/store-sd --max-tokens 2000000 --init runs/bpd-sd \
  --init-module $CK/hydra --lr 3e-4 --epochs 2 --max-minutes 12 --threads 2 --out runs/hydra-sd > runs/hydra-sd.log 2>&1
