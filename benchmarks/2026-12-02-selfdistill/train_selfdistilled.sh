#!/bin/bash
# The fine-tunes of 2026-12-02 on the target's own replies (from `blockdraft selfdistill ... --batch 8 --turns 2`):
# BPD heads, then hydra's AR module on them; the block drafter, then TreeFlash's AR module on it. Each starts
# from its shipped checkpoint; the first command builds the feature stores (runs/store-sd, runs/store-sd-valid).
set -e
D=runs/sd/sharegpt-smollm2-sd.jsonl
CK=src/blockdraft/checkpoints/smollm2-135m
run() { blockdraft train --data $D --store runs/store-sd --max-tokens 2000000 --lr 3e-4 --epochs 2 --threads 2 "$@"; }
run --drafter heads --init $CK/bpd --max-minutes 12 --out runs/bpd-sd
run --drafter treeflash --init runs/bpd-sd --init-module $CK/hydra --max-minutes 12 --out runs/hydra-sd
run --drafter block --init $CK/dflash --max-minutes 10 --out runs/dflash-sd
run --drafter treeflash --init runs/dflash-sd --init-module $CK/treeflash --max-minutes 8 --out runs/treeflash-sd
