#!/bin/bash
# Hydra's and TreeFlash's AR modules widened 1152 -> 1728 (the widest that keeps the shipped checkpoints under
# 60 MB with one module widened) and fine-tuned on fresh self-distilled replies, beside the unwidened shipped
# modules fine-tuned the same way (the control), then decoded on held-out ShareGPT.
# Fresh replies: ShareGPT's conversations in reverse order, so that the prompts are not those of the earlier rounds
# (which answered the file from its start). Usage: bash run.sh sd | train | heldout
set -e
CK=src/blockdraft/checkpoints/smollm2-135m
W=runs/sd5
case $1 in
sd)
  python - <<'PY'
import json
from blockdraft.data.sharegpt import data_path, load_conversations
with open("runs/sd5/prompts.jsonl", "w") as f:
    for r in reversed(load_conversations(data_path("sharegpt"))):
        f.write(json.dumps(r) + "\n")
PY
  blockdraft selfdistill $W/sd.jsonl --data $W/prompts.jsonl --batch 8 --turns 2 --max-tokens 3000000 \
    --max-minutes 65 --threads 2
  ;;
train)
  # the first command builds the feature stores runs/store-sd5(-valid) from the replies
  run() { blockdraft train --drafter treeflash --data $W/sd.jsonl --store runs/store-sd5 --max-tokens 2000000 \
            --lr 3e-4 --epochs 2 --max-minutes 10 --threads 2 "$@"; }
  run --init $CK/bpd --init-module $CK/hydra --inner-size 1728 --out $W/hydra-wide      # widened, then fine-tuned
  run --init $CK/bpd --init-module $CK/hydra --out $W/hydra-ctl                         # the control: 1152
  run --init $CK/dflash --init-module $CK/treeflash --inner-size 1728 --out $W/treeflash-wide
  run --init $CK/dflash --init-module $CK/treeflash --out $W/treeflash-ctl
  ;;
heldout)
  blockdraft bench --questions sharegpt --per-category 20 --max-new-tokens 128 --threads 2 --no-compile \
    --methods ar,hydra,hydra:module=$W/hydra-wide,hydra:module=$W/hydra-ctl,treeflash:budget=32,treeflash:budget=32:module=$W/treeflash-wide,treeflash:budget=32:module=$W/treeflash-ctl \
    --out benchmarks/2026-12-04-wide-selfdistill/heldout
  ;;
esac
