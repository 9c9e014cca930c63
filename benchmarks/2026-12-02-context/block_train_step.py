"""One block-drafter training step (forward + backward, bf16 autocast, 512 block rows over 512 context tokens): times the attention path."""
import torch, time
from blockdraft.drafters.block import BlockConfig, BlockModel
torch.set_num_threads(2)
c = BlockConfig(hidden_size=576, feature_layers=(1,2,3), num_heads=9, num_kv_heads=3, intermediate_size=1536)
m = BlockModel(c)
t, nb = 512, 64*8
ctx = torch.randn(t, 576); x = torch.randn(nb, 576, requires_grad=True)
pos = torch.arange(nb) % 8 + 100
allowed = torch.rand(nb, t + nb) > 0.5
def step():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        kv = m.context(ctx, torch.arange(t))
        h = m(x, pos, kv, allowed)
    h.float().sum().backward()
for _ in range(2): step()
ts=[]
for _ in range(6):
    t0=time.perf_counter(); step(); ts.append(time.perf_counter()-t0)
ts.sort(); print(f"{ts[3]*1e3:.0f} ms")
