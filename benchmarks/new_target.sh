#!/usr/bin/env bash
# Drafters for a new target on a 2-core CPU, from nothing: self-distilled replies, then a block drafter + TreeFlash
# module and BPD heads + Hydra module on them, each stage capped in minutes. Prints each stage's wall time.
#   benchmarks/new_target.sh TARGET OUT_DIR [SELFDISTILL_MIN BLOCK_MIN TREEFLASH_MIN HEADS_MIN HYDRA_MIN]
# (a stage given 0 minutes is skipped; SELFDISTILL_MIN 0: train on the replies OUT_DIR/selfdistill.jsonl holds)
# e.g. benchmarks/new_target.sh gemma3-270m runs/gemma3-drafters   (defaults: 15 12 8 6 6 minutes)
# The bpd + hydra measured for gemma3-270m (55 min; BENCHMARKS.md, "Any target"; its heads ran --epochs 2: in 6
# minutes either count stops at the time limit, its learning rate decayed over the minutes):
#   STORE=630000 MORE_DATA=sharegpt EPOCHS=4 benchmarks/new_target.sh gemma3-270m DIR 15 0 0 6 12
set -euo pipefail
TARGET=${1:?target name or path}; OUT=${2:?output folder}
SD=${3:-15}; BLOCK=${4:-12}; TF=${5:-8}; HEADS=${6:-6}; HYDRA=${7:-6}
TOKENS=${TOKENS:-200000}  # self-distilled reply tokens at most (the minutes usually stop it first)
STORE=${STORE:-400000}  # conversation tokens (prompts and replies) in the feature store, at most
MORE_DATA=${MORE_DATA:-}  # e.g. 'sharegpt' (with a larger STORE): filled in after the self-distilled replies
EPOCHS=${EPOCHS:-}  # every stage's epochs (default 8 block, 6 the rest): the cosine schedule spans them, so
                    # choose what the minutes can cover
mkdir -p "$OUT"
DATA="$OUT/selfdistill.jsonl"
t0=$(date +%s)
stage() {  # stage NAME MINUTES COMMAND...: run it (unless MINUTES is 0), log it, print its minutes
    local name=$1 minutes=$2; shift 2
    if [ "$minutes" = 0 ]; then echo "[$name] skipped (0 minutes)"; return; fi
    local s=$(date +%s)
    echo "[$name] $*"
    "$@" > "$OUT/$name.log" 2>&1
    echo "[$name] $(( ($(date +%s) - s) / 60 )) min $(( ($(date +%s) - s) % 60 )) s (total $(( ($(date +%s) - t0) / 60 )) min)"
}
stage selfdistill "$SD" blockdraft selfdistill "$DATA" --target "$TARGET" --batch 8 --max-new-tokens 256 \
    --max-tokens "$TOKENS" --max-minutes "$SD"
COMMON=(--target "$TARGET" --data "$DATA${MORE_DATA:+,$MORE_DATA}" --max-tokens "$STORE" --valid-tokens 10000)
stage block "$BLOCK" blockdraft train --drafter dflash --num-layers 1 --out "$OUT/dflash" --max-minutes "$BLOCK" \
    --epochs "${EPOCHS:-8}" "${COMMON[@]}"
stage treeflash "$TF" blockdraft train --drafter treeflash --init "$OUT/dflash" --out "$OUT/treeflash" \
    --max-minutes "$TF" --epochs "${EPOCHS:-6}" --inner-size 1024 "${COMMON[@]}"  # 1024: the pair fits 22 MB
stage heads "$HEADS" blockdraft train --drafter bpd --out "$OUT/bpd" --max-minutes "$HEADS" --epochs "${EPOCHS:-6}" \
    "${COMMON[@]}"
# --copy: the module also reads each parent's copy token (held-out hydra tau on Gemma 3: BENCHMARKS.md, "Any
# target"); 896 units keep such a pair at 20 MB
stage hydra "$HYDRA" blockdraft train --drafter treeflash --copy --inner-size 896 --init "$OUT/bpd" --out "$OUT/hydra" \
    --max-minutes "$HYDRA" --epochs "${EPOCHS:-6}" "${COMMON[@]}"
echo "all stages: $(( ($(date +%s) - t0) / 60 )) min"
