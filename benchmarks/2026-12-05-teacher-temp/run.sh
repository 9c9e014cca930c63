#!/bin/bash
# Sharpened teacher for greedy drafting: fine-tunes of the shipped bpd heads on the last round's self-distilled
# replies (runs/sd5, store runs/store-sd5), the teacher's top-32 raised to 1/T and renormalised (T = 1: today's KL).
# The option was temporary: apply teacher_temp.diff (BD_TEACHER_TEMP) first, `git apply` from the repository root.
# Usage: bash run.sh bpd
set -e
D=benchmarks/2026-12-05-teacher-temp
CK=src/blockdraft/checkpoints/smollm2-135m
W=runs/tt
mkdir -p $W
run() { blockdraft train --data runs/sd5/sd.jsonl --store runs/store-sd5 --max-tokens 2000000 --lr 3e-4 --epochs 2 \
          --threads 2 "$@"; }
case $1 in
bpd)
  for T in 1 0.5 0.25; do
    BD_TEACHER_TEMP=$T run --drafter heads --init $CK/bpd --max-minutes 6 --out $W/bpd-t$T > $W/bpd-t$T.log 2>&1
  done
  ;;
esac
