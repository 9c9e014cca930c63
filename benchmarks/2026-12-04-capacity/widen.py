"""Widen an AR module without changing what it computes (Net2Net-style), to fine-tune the extra units.

    python benchmarks/2026-12-04-capacity/widen.py SHIPPED_MODULE_DIR BASE_DIR OUT_DIR --inner 2048

The new hidden units get random gate/up rows (scaled like the old ones) and zero columns in the down projection,
so the widened module's output equals the original's exactly until training moves them. The widening itself is
`blockdraft.train.treeflash.widen` (since 2026-12-04, late: `blockdraft train --init-module M --inner-size N`); its added units' random draws
differ from those of the run recorded in BENCHMARKS.md (2026-12-04, evening), which were drawn here.
"""
import argparse

import torch

from blockdraft.api import load_target
from blockdraft.drafters.treeflash import TreeFlashDrafter
from blockdraft.train.treeflash import load_base, widen


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
    torch.manual_seed(0)
    new = widen(old, args.inner, args.module)  # what `blockdraft train --init-module M --inner-size N` starts from
    new.config.training = {"widened_from": str(args.module), "inner_before": old.config.inner_size,
                           "init_training": old.config.training}
    h = torch.randn(64, old.config.hidden_size, device=target.device)
    e = torch.randn(64, old.config.hidden_size, device=target.device)
    assert torch.allclose(new(h, e), old(h, e), atol=1e-5), "the widened module must compute the same"
    drafter = TreeFlashDrafter(base, new.eval())
    drafter.save_pretrained(args.out, target)
    print(f"wrote {args.out}: inner {old.config.inner_size} -> {args.inner}, the same function")


if __name__ == "__main__":
    main()
