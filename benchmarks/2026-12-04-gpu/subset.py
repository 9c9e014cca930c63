"""Write a random part of ShareGPT's training split (and all of its held-out part) as compressed JSON for the
GPU machine, which reaches no package registry and takes at most 64 MiB a call.

Each conversation is cut after the message that passes `--chars` characters: a feature store keeps only its first
2,048 tokens (--max-len), so what follows never reaches training. With --prompts-only (for self-distillation on the
GPU) only each conversation's first human turn is kept, and none longer than 2,000 characters: the prompts
selfdistill_hf.py answers are at most 256 tokens."""

import argparse
import json
import lzma
import random

from blockdraft.data.sharegpt import load_conversations, split_conversations

p = argparse.ArgumentParser()
p.add_argument("out", help="output .json.xz")
p.add_argument("--records", type=int, default=6000, help="training conversations kept")
p.add_argument("--chars", type=int, default=16000)
p.add_argument("--prompts-only", action="store_true")
args = p.parse_args()

train, valid = split_conversations(load_conversations())
random.Random(0).shuffle(train)


def cut(record):
    kept, chars = [], 0
    for m in record["conversations"]:
        kept.append(m)
        chars += len(m.get("value", ""))
        if chars > args.chars:
            break
    return {"id": record["id"], "conversations": kept}


def first_prompt(record):
    first = record["conversations"][0]
    ok = first.get("from") == "human" and 0 < len(first.get("value", "")) <= 2000
    return {"id": record["id"], "conversations": [first]} if ok else None


if args.prompts_only:
    records = [r for r in map(first_prompt, train[: args.records] + valid) if r is not None]
else:
    records = [cut(r) for r in train[: args.records] + valid]
with lzma.open(args.out, "wt", encoding="utf-8", preset=6) as f:
    json.dump(records, f, ensure_ascii=False)
print(f"{args.out}: {len(records)} records from {min(args.records, len(train))} training and {len(valid)} held-out "
      "conversations")
