"""Scratch: max_rows 8 vs 16 at batch 8 (compiled, chunked prefill), held-out ShareGPT, 3 alternating reps."""
import time, torch
torch.set_num_threads(2)
from blockdraft.api import load_target
from blockdraft.methods import make_drafter
from blockdraft.decoding import BatchDecoder
from blockdraft.data.sharegpt import load_conversations, split_conversations, user_prompts
t = load_target(None, compile=True)
_, valid = split_conversations(load_conversations())
prompts = [t.encode(p) for p in user_prompts(valid, max_chars=1500)[:24]]
drafter = make_drafter("lookup", t)
decoders = {mr: BatchDecoder(t, max_batch=8, max_rows=mr) for mr in (8, 16)}
def run(mr):
    dec = decoders[mr]
    pending = list(prompts); seqs = []; t0 = time.perf_counter()
    while pending or dec.active:
        while pending and dec.free:
            seqs.append(dec.add(pending.pop(0), drafter, max_new_tokens=64))
        dec.step()
    dt = time.perf_counter() - t0
    return sum(len(s.result.tokens) for s in seqs) / dt
run(8); run(16)
res = {8: [], 16: []}
for rep in range(3):
    for mr in (8, 16):
        res[mr].append(run(mr))
for mr, v in res.items():
    print(mr, [f"{a:.1f}" for a in v], "median", f"{sorted(v)[1]:.1f}")
