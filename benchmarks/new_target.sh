#!/usr/bin/env bash
# Drafters for a new target on a 2-core CPU, from nothing: self-distilled replies, then a block drafter + TreeFlash
# module and BPD heads + Hydra module on them, each stage capped in minutes. Prints each stage's wall time.
#   benchmarks/new_target.sh TARGET OUT_DIR [SELFDISTILL_MIN BLOCK_MIN TREEFLASH_MIN HEADS_MIN HYDRA_MIN]
# (SELFDISTILL_MIN 0: train on the replies OUT_DIR/selfdistill.jsonl already holds)
# e.g. benchmarks/new_target.sh gemma3-270m runs/gemma3-drafters   (defaults: 15 12 8 6 6 minutes)
set -euo pipefail
TARGET=${1:?target name or path}; OUT=${2:?output folder}
SD=${3:-15}; BLOCK=${4:-12}; TF=${5:-8}; HEADS=${6:-6}; HYDRA=${7:-6}
TOKENS=${TOKENS:-200000}  # self-distilled reply tokens at most (the minutes usually stop it first)
STORE=${STORE:-400000}  # conversation tokens (prompts and replies) in the feature store, at most
MORE_DATA=${MORE_DATA:-}  # e.g. 'sharegpt' (with a larger STORE): filled in after the self-distilled replies
mkdir -p "$OUT"
DATA="$OUT/selfdistill.jsonl"
t0=$(date +%s)
stage() {  # stage NAME COMMAND...: run it, log it, print its minutes
    local name=$1; shift
    local s=$(date +%s)
    echo "[$name] $*"
    "$@" > "$OUT/$name.log" 2>&1
    echo "[$name] $(( ($(date +%s) - s) / 60 )) min $(( ($(date +%s) - s) % 60 )) s (total $(( ($(date +%s) - t0) / 60 )) min)"
}
if [ "$SD" != 0 ]; then  # 0: keep the replies DATA already holds
    stage selfdistill blockdraft selfdistill "$DATA" --target "$TARGET" --batch 8 --max-new-tokens 256 \
        --max-tokens "$TOKENS" --max-minutes "$SD"
fi
COMMON=(--target "$TARGET" --data "$DATA${MORE_DATA:+,$MORE_DATA}" --max-tokens "$STORE" --valid-tokens 10000)
stage block blockdraft train --drafter dflash --num-layers 1 --out "$OUT/dflash" --max-minutes "$BLOCK" --epochs 8 \
    "${COMMON[@]}"
stage treeflash blockdraft train --drafter treeflash --init "$OUT/dflash" --out "$OUT/treeflash" \
    --max-minutes "$TF" --epochs 6 --inner-size 1024 "${COMMON[@]}"  # 1024: the shipped pair fits 22 MB
stage heads blockdraft train --drafter bpd --out "$OUT/bpd" --max-minutes "$HEADS" --epochs 6 "${COMMON[@]}"
stage hydra blockdraft train --drafter treeflash --init "$OUT/bpd" --out "$OUT/hydra" --max-minutes "$HYDRA" \
    --epochs 6 "${COMMON[@]}"
echo "all stages: $(( ($(date +%s) - t0) / 60 )) min"
