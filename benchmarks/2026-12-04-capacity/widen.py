"""Widen an AR module without changing what it computes (Net2Net-style), to fine-tune the extra units.

    python benchmarks/2026-12-04-capacity/widen.py SHIPPED_MODULE_DIR BASE_DIR OUT_DIR --inner 2048

The new hidden units get random gate/up rows (scaled like the old ones) and zero columns in the down projection,
so the widened module's output equals the original's exactly until training moves them.
"""
import argparse

import torch

from blockdraft.api import load_target
from blockdraft.drafters.treeflash import ARApproxConfig, ARApproxModule, TreeFlashDrafter
from blockdraft.train.treeflash import load_base


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("module")
    p.add_argument("base")
    p.add_argument("out")
    p.add_argument("--inner", type=int, default=2048)
    args = p.parse_args()
    target = load_target(None)
    base = load_base(args.base, target)
    old = TreeFlashDrafter.from_pretrained(args.module, target, base).module.float()
    c = old.config
    if args.inner <= c.inner_size:
        raise SystemExit(f"--inner must exceed the module's {c.inner_size}")
    cfg = ARApproxConfig(c.hidden_size, args.inner, c.rms_eps, c.block_drafter, c.base_kind, c.draft_vocab,
                         {"widened_from": str(args.module), "inner_before": c.inner_size, "init_training": c.training})
    new = ARApproxModule(cfg).to(target.device)
    torch.manual_seed(0)
    n = c.inner_size
    with torch.no_grad():
        new.norm_parent.weight.copy_(old.norm_parent.weight)
        new.norm_state.weight.copy_(old.norm_state.weight)
        for name in ("gate", "up"):
            w_old, w_new = getattr(old, name).weight, getattr(new, name).weight
            w_new[:n] = w_old
            w_new[n:] = torch.randn_like(w_new[n:]) * w_old.std()
        new.down.weight.zero_()
        new.down.weight[:, :n] = old.down.weight
    h = torch.randn(64, c.hidden_size, device=target.device)
    e = torch.randn(64, c.hidden_size, device=target.device)
    assert torch.allclose(new(h, e), old(h, e), atol=1e-5), "the widened module must compute the same"
    drafter = TreeFlashDrafter(base, new.eval())
    drafter.save_pretrained(args.out, target)
    print(f"wrote {args.out}: inner {n} -> {args.inner}, the same function")


if __name__ == "__main__":
    main()
