"""Training TreeFlash's AR-approximation module on top of a frozen block drafter (teacher forcing)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..drafters.block import BlockDrafter
from ..drafters.treeflash import ARApproxConfig, ARApproxModule, TreeFlashDrafter
from ..errors import BlockdraftError
from .block import block_batch, block_hidden, pick_anchors
from .common import DraftMetrics, Teacher, Trainer, depth_weights, distill_loss
from .features import FeatureStore


@dataclass
class TreeFlashTrainConfig:
    init: str | None = None  # the block drafter checkpoint (required)
    inner_size: int = 1152
    epochs: float = 2.0
    lr: float = 1e-3
    anchors_per_seq: int = 64
    max_minutes: float = 0.0
    seed: int = 0


def module_batch(drafter: BlockDrafter, store: FeatureStore, a: int, b: int, cols, anchors):
    """(frozen block states [A, g-1, H], true parent tokens [A, g-1], teacher rows, valid)."""
    g = drafter.config.gamma
    feats, roots, pos, allowed, rows, ok = block_batch(store, a, b, cols, g, anchors)
    with torch.no_grad():
        h = block_hidden(drafter.model, drafter.embed, feats, roots, pos, allowed)
    # block position j+1 drafts token p+j+1; its true parent is token p+j, the teacher row's own token
    parents = torch.from_numpy(np.asarray(store.tokens[rows.reshape(-1)], dtype=np.int64)).view(rows.shape)
    return h, parents, rows, ok


def train_treeflash(target, store: FeatureStore, valid: FeatureStore | None, out, cfg: TreeFlashTrainConfig,
                    resume: bool = False) -> TreeFlashDrafter:
    if not cfg.init:
        raise BlockdraftError("--drafter treeflash trains on top of a block drafter: pass --init DRAFTER_DIR")
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    block = BlockDrafter.from_pretrained(cfg.init, target)
    for p in block.model.parameters():
        p.requires_grad_(False)
    module = ARApproxModule(ARApproxConfig(target.hidden_size, cfg.inner_size, block_drafter=str(cfg.init)))
    drafter = TreeFlashDrafter(block, module)
    t2d = block.lm_head.target_to_draft(target.vocab_size)
    cols = store.layer_slice(block.feature_layers)
    g = block.config.gamma
    weights = depth_weights(g - 1, g)  # earlier depths weigh more
    seqs = [(a, b) for a, b in store.sequences() if b - a >= 8]
    steps = int(cfg.epochs * len(seqs))
    evaluate = (lambda: evaluate_treeflash(drafter, valid, max_seqs=40)) if valid is not None else None
    trainer = Trainer(module, out, cfg.lr, steps, cfg.max_minutes, resume=resume, desc="TreeFlash module",
                      evaluate=evaluate)
    module.train()
    going = trainer.step_no < steps
    while going:
        for j in rng.permutation(len(seqs)):
            a, b = seqs[j]
            anchors = pick_anchors(store, a, b, cfg.anchors_per_seq, rng)
            if len(anchors) == 0:
                continue
            h, parents, rows, ok = module_batch(block, store, a, b, cols, anchors)
            logits = block.lm_head(module(h, block.embed[parents]))
            loss = distill_loss(logits, Teacher.gather(store, rows, t2d), ok.float() * weights)
            going = trainer.step(loss)
            if not going:
                break
    trainer.close()
    module.eval()
    module.config.training = trainer.record(cfg, store)
    if valid is not None:
        metrics = evaluate_treeflash(drafter, valid)
        module.config.training.update(valid_accuracy=[round(x, 4) for x in metrics.accuracy])
        print("with the true parent, " + metrics.summary())
    drafter.save_pretrained(out, target)
    return drafter


@torch.inference_mode()
def evaluate_treeflash(drafter: TreeFlashDrafter, store: FeatureStore, anchors_per_seq: int = 16, seed: int = 1,
                       max_seqs: int | None = None) -> DraftMetrics:
    """Per-depth top-1 agreement given the true parent (what a tree can exploit), on held-out data."""
    rng = np.random.default_rng(seed)
    block = drafter.block
    cols = store.layer_slice(block.feature_layers)
    metrics = DraftMetrics()
    for a, b in list(store.sequences())[:max_seqs]:
        anchors = pick_anchors(store, a, b, anchors_per_seq, rng)
        if len(anchors) == 0:
            continue
        h, parents, rows, ok = module_batch(block, store, a, b, cols, anchors)
        logits = block.lm_head(drafter.module(h, block.embed[parents]))
        draft = block.lm_head.to_target_ids(logits.argmax(-1))
        teacher_top1 = torch.from_numpy(np.asarray(store.topk_ids[rows.reshape(-1), 0], dtype=np.int64))
        metrics.add(draft, teacher_top1.view(rows.shape), ok)
    return metrics
