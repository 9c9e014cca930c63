"""How often a parent's copy token is the target's top-1, beside an AR module's own top-1 (given the true parent).

The copy token (drafters/context_copy.py) is the token that followed the parent's last occurrence in the context.
Per hydra depth on a validation feature store: the module's top-1 agreement, the copy token's, and the share where
only the copy token is right: what a module that reads it could gain. E.g. (Gemma 3 270M, 2026-12-07):

    python benchmarks/copy_potential.py --target gemma3-270m --bpd src/blockdraft/checkpoints/gemma3-270m/bpd \
        --module runs/gemma-ship/checkpoints/hydra --store ~/.cache/blockdraft/features/gemma3-270m-...-valid-...
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from blockdraft import load_target
from blockdraft.drafters.treeflash import TreeFlashDrafter
from blockdraft.train.bpd import HeadPositions
from blockdraft.train.features import FeatureStore
from blockdraft.train.treeflash import Copies, copy_embeddings, heads_module_batch, load_base, parent_embeddings


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--bpd", required=True, help="the BPD heads the module was trained on")
    p.add_argument("--module", required=True, help="an AR module (hydra) on those heads")
    p.add_argument("--store", required=True, help="a validation feature store of the target")
    args = p.parse_args()
    target = load_target(args.target)
    store = FeatureStore.open(args.store)
    base = load_base(args.bpd, target)
    module = TreeFlashDrafter.from_pretrained(args.module, target, base).module.float()
    positions = HeadPositions(store, base.config.num_heads)
    columns = store.layer_slice(base.feature_layers)
    reads_copies = Copies(store, module.config.copy)
    copies = Copies(store, True)
    counts = np.zeros((base.config.num_heads, 4))  # positions, module right, copy right, only the copy right
    with torch.inference_mode():
        for i in range(0, len(positions.candidates), 256):
            at = np.sort(positions.candidates[i : i + 256])
            h, parents, rows, ok, own = heads_module_batch(base, store, positions, columns, at, reads_copies)
            out = module(h.float(), parent_embeddings(base, parents).float(), copy_embeddings(base, own))
            draft = base.lm_head.to_target_ids(base.lm_head(out).argmax(-1)).numpy()
            teacher = np.asarray(store.topk_ids[rows.reshape(-1), 0]).reshape(rows.shape)
            copy = copies(at + 1, rows).numpy()
            for d in range(draft.shape[1]):
                m = ok.numpy()[:, d]
                right, copied = draft[m, d] == teacher[m, d], copy[m, d] == teacher[m, d]
                counts[d] += [m.sum(), right.sum(), copied.sum(), (copied & ~right).sum()]
    for d, (n, right, copied, only) in enumerate(counts):
        print(f"depth {d}: {int(n):,} positions, module top-1 {right / n:.3f}, copy token {copied / n:.3f}, "
              f"copy right where the module is wrong {only / n:.3f}")


if __name__ == "__main__":
    main()
