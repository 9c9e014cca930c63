#!/bin/bash
# One round of self-distilled fine-tunes: the conversations `blockdraft selfdistill` wrote since the last round
# (from line FIRST of its file on), each drafter from its shipped checkpoint, lr 3e-4, time-boxed, 2 threads.
# Writes runs/{bpd,hydra,dflash,treeflash}-NAME; the first command builds the feature stores runs/store-NAME(-valid).
# Usage: finetune.sh FIRST NAME
set -e
FIRST=$1 NAME=$2
D=runs/sd/part-$NAME.jsonl
tail -n +$FIRST runs/sd/sharegpt-smollm2-sd.jsonl > $D
CK=src/blockdraft/checkpoints/smollm2-135m
run() { blockdraft train --data $D --store runs/store-$NAME --max-tokens 2000000 --lr 3e-4 --epochs 2 --threads 2 "$@"; }
run --drafter heads --init $CK/bpd --max-minutes 6 --out runs/bpd-$NAME
run --drafter treeflash --init runs/bpd-$NAME --init-module $CK/hydra --max-minutes 7 --out runs/hydra-$NAME
run --drafter block --init $CK/dflash --max-minutes 10 --out runs/dflash-$NAME
run --drafter treeflash --init runs/dflash-$NAME --init-module $CK/treeflash --max-minutes 7 --out runs/treeflash-$NAME
