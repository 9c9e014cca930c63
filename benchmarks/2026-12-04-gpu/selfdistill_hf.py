"""Self-distilled replies on a GPU: the target's greedy replies to ShareGPT prompts, many at once through
transformers' `generate`, written in the JSONL format of `blockdraft selfdistill` (so `blockdraft train --data`
reads them).

Why not `blockdraft selfdistill --batch N` there: our batch engine is built for a CPU (a few sequences, a
forward over 8 rows costing about one row's) and has not run on CUDA; on a GPU the target's forward over
hundreds of rows costs about one row's, so `generate` with a few hundred left-padded prompts gives far more
tokens a second. Left padding and batched bf16 kernels can flip a numeric near-tie, so a reply may differ from
the target's one-sequence greedy reply in rare tokens: training data, not output we promise to reproduce.

    python selfdistill_hf.py OUT.jsonl --data sharegpt.json [--batch 256] [--max-minutes 3] [--device cuda]
"""

import argparse
import itertools
import json
import time

import torch

from blockdraft import Target
from blockdraft.data.selfdistill import human_turns
from blockdraft.data.sharegpt import data_path, load_conversations, split_conversations

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--data", default="sharegpt")
p.add_argument("--batch", type=int, default=256)
p.add_argument("--max-new-tokens", type=int, default=256)
p.add_argument("--max-prompt-tokens", type=int, default=256)
p.add_argument("--max-minutes", type=float, default=3.0)
p.add_argument("--max-tokens", type=int, default=10_000_000)
p.add_argument("--valid-prompts", type=int, default=300, help="held-out prompts answered first, for validation")
p.add_argument("--device", default="auto")
args = p.parse_args()

target = Target.load("smollm2-135m", "bfloat16", args.device)
tok, model = target.tokenizer, target.model
pad = tok.pad_token_id if tok.pad_token_id is not None else min(target.eos_token_ids)
train, valid = split_conversations(load_conversations(data_path(args.data)))
prompts = itertools.chain(itertools.islice(human_turns(valid, 1), args.valid_prompts), human_turns(train, 1))
settings = {"target": target.name, "method": "ar (transformers generate, batched, left padded)", "temperature": 0.0,
            "dtype": "bfloat16", "turns": 1, "batch": args.batch}
t0, written, tokens = time.time(), 0, 0
with open(args.out, "w", encoding="utf-8") as f:
    while time.time() - t0 < 60 * args.max_minutes and tokens < args.max_tokens:
        chunk = []
        for rid, texts in prompts:
            ids = target.encode_chat([{"role": "user", "content": texts[0]}])
            if len(ids) <= args.max_prompt_tokens:
                chunk.append((rid, texts[0], ids))
            if len(chunk) == args.batch:
                break
        if not chunk:
            break
        width = max(len(ids) for _, _, ids in chunk)
        x = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros_like(x)
        for i, (_, _, ids) in enumerate(chunk):
            x[i, width - len(ids):] = torch.tensor(ids)
            mask[i, width - len(ids):] = 1
        with torch.inference_mode():
            out = model.generate(input_ids=x.to(target.device), attention_mask=mask.to(target.device),
                                 max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=pad,
                                 eos_token_id=sorted(target.eos_token_ids))
        for (rid, question, _), row in zip(chunk, out[:, width:].tolist(), strict=True):
            reply = list(itertools.takewhile(lambda t: t not in target.eos_token_ids, row))
            text = target.decode(reply)
            if not text.strip():
                continue
            turns = [{"from": "human", "value": question}, {"from": "gpt", "value": text}]
            record = {"id": rid, "conversations": turns, "reply_tokens": len(reply), "selfdistill": settings}
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            written, tokens = written + 1, tokens + len(reply)
        print(f"{written} replies, {tokens:,} reply tokens, {tokens / (time.time() - t0):,.0f} tokens/s", flush=True)
print(f"wrote {args.out}: {written} replies, {tokens:,} reply tokens in {(time.time() - t0) / 60:.1f} min")
