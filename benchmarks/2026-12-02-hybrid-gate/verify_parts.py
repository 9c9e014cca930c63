"""Where a verification step's time goes: compiled forward vs logits to float/CPU vs argmax."""
import time, statistics, torch
from blockdraft import load_target
from blockdraft.trees import DraftTree
torch.set_num_threads(2)
t = load_target(dtype="bfloat16", compile=True)
g = torch.Generator().manual_seed(0)
t.prefill(torch.randint(t.vocab_size, (300,), generator=g).tolist())
f = t.forwarder
for b in (0, 8, 16, 24, 32):
    parents = [-1] + [int(torch.randint(i, (), generator=g)) for i in range(1, b + 1)]
    tree = DraftTree(torch.randint(t.vocab_size, (b + 1,), generator=g), torch.tensor(parents))
    fw, post, full = [], [], []
    for rep in range(25):
        with torch.inference_mode():
            s = time.perf_counter()
            allowed = None if tree.is_chain() else tree.ancestor_mask()
            logits, hidden = f.forward(tree.tokens, t.length + tree.depth, allowed, t.feature_layers)
            m = time.perf_counter()
            x = logits.float().cpu(); x.max(-1).indices.tolist()
            e = time.perf_counter()
        f.commit(t.length, []) if hasattr(f, "commit") else None
        t.commit([])
        fw.append(m - s); post.append(e - m)
    print(f"B={b}: forward {1000*statistics.median(fw[3:]):.2f} ms, logits->float+argmax {1000*statistics.median(post[3:]):.2f} ms")
