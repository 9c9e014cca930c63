"""Batch-8 decoding of 16 held-out ShareGPT prompts (lookup, 64 tokens) under different BatchDecoder max_rows caps."""
import time, torch
torch.set_num_threads(2)
from blockdraft.api import load_target
from blockdraft.methods import make_drafter
from blockdraft.decoding import BatchDecoder
from blockdraft.bench import load_questions
t = load_target(None)
from blockdraft.data.sharegpt import load_conversations, split_conversations, user_prompts
_, valid = split_conversations(load_conversations())
prompts = [t.encode(p) for p in user_prompts(valid, max_chars=1500)[:16]]
drafter = make_drafter("lookup", t)
def run(max_rows):
    dec = BatchDecoder(t, max_batch=8, max_rows=max_rows)
    pending = list(prompts); seqs = []; t0 = time.perf_counter()
    while pending or dec.active:
        while pending and dec.free:
            seqs.append(dec.add(pending.pop(0), drafter, max_new_tokens=64))
        dec.step()
    dt = time.perf_counter() - t0
    toks = sum(len(s.result.tokens) for s in seqs)
    return toks / dt, sum(s.stats.target_calls for s in seqs)
run(64)
res = {}
for rep in range(1):
    for mr in (None, 16, 32, 64):
        res.setdefault(mr, []).append(run(mr))
for mr, v in res.items():
    print(mr, [f"{a:.1f} tok/s, {c} calls" for a, c in v])
