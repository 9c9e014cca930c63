"""Training TreeFlash's AR-approximation module on a frozen DFlash or BPD drafter (teacher forcing)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from ..drafters.bpd import BPDDrafter
from ..drafters.checkpoint import read_config
from ..drafters.dflash import DFlashDrafter
from ..drafters.context_copy import copy_tokens, previous_same
from ..drafters.treeflash import ARApproxConfig, ARApproxModule, TreeFlashDrafter, token_embeddings
from ..errors import BlockdraftError
from .bpd import HeadPositions
from .dflash import block_batch, block_hidden, pick_anchors
from .distill import Teacher, depth_weights, distill_loss
from .features import FeatureStore
from .metrics import DraftMetrics
from .precision import for_training, mixed_precision
from .trainer import Trainer


@dataclass
class TreeFlashTrainConfig:
    init: str | None = None  # the base drafter checkpoint (required): a DFlash or a BPD drafter
    init_module: str | None = None  # start from this AR module (trained on the same base): fine-tuning
    batch: int = 256  # positions per step, on BPD heads
    inner_size: int | None = None  # a new module's width (default 1152); with init_module, widen it to this
    epochs: float = 2.0
    lr: float = 1e-3
    anchors_per_seq: int = 0  # on a DFlash drafter; 0: one per gamma - 1 reply positions (train/dflash.py)
    max_minutes: float = 0.0
    stop_at_step: int = 0
    seed: int = 0
    copy: bool = False  # a new module also reads each parent's copy token (drafters/context_copy.py)


class Copies:
    """The copy tokens of a store's parents (drafters/context_copy.py), or nothing for a module without copy."""

    def __init__(self, store: FeatureStore, on: bool):
        self.tokens = np.asarray(store.tokens, dtype=np.int64) if on else None
        self.prev = previous_same(self.tokens, np.asarray(store.starts)) if on else None

    def __call__(self, roots: np.ndarray, rows: np.ndarray) -> torch.Tensor | None:
        if self.tokens is None:
            return None
        return torch.from_numpy(copy_tokens(self.tokens, self.prev, roots, rows))


def module_batch(drafter: DFlashDrafter, store: FeatureStore, a: int, b: int, cols, anchors, copies: Copies):
    """(frozen block states [A, g-1, H], true parent tokens [A, g-1], teacher rows, valid, copy tokens or None)."""
    g = drafter.config.gamma
    feats, roots, pos, allowed, rows, ok = block_batch(store, a, b, cols, g, anchors, drafter.embed.device)
    with torch.no_grad():
        h = block_hidden(drafter.model, drafter.embed, feats, roots, pos, allowed)
    return h, true_parents(store, rows), rows, ok, copies(anchors + a, rows)  # a block's root is its anchor


def heads_module_batch(drafter: BPDDrafter, store: FeatureStore, positions: HeadPositions, col, p: np.ndarray,
                       copies: Copies):
    """The same for BPD heads at state positions p: (frozen head states [B, k, H], parents, rows, valid,
    copies)."""
    rows, ok = positions.batch(p)
    with torch.no_grad():
        h = drafter.model(store.read(p, col, drafter.embed.device))
    return h, true_parents(store, rows), rows, ok, copies(p + 1, rows)  # the state at p is read with root p + 1


def true_parents(store: FeatureStore, rows: np.ndarray) -> torch.Tensor:
    # the teacher row r holds the target's distribution *after* token r, so token r is the true parent
    return torch.from_numpy(np.asarray(store.tokens[rows.reshape(-1)], dtype=np.int64)).view(rows.shape)


def parent_embeddings(base, parents: torch.Tensor) -> torch.Tensor:
    return base.embed[parents.to(base.embed.device)]


def copy_embeddings(base, copies: torch.Tensor | None) -> torch.Tensor | None:
    return None if copies is None else token_embeddings(base, copies)


def load_base(folder, target):
    """The frozen drafter the module builds on, whichever kind the checkpoint holds (in float32, on the
    target's device)."""
    kind = read_config(folder).get("blockdraft_drafter")
    if kind not in ("dflash", "bpd"):
        raise BlockdraftError(f"--init '{folder}' must be a dflash or bpd drafter checkpoint (found {kind})")
    base = for_training((DFlashDrafter if kind == "dflash" else BPDDrafter).from_pretrained(folder, target))
    for p in base.model.parameters():
        p.requires_grad_(False)
    return base


def batch_source(base, store: FeatureStore, cfg: "TreeFlashTrainConfig"):
    """What one epoch permutes for either base, items per batch, and batch(items, rng) -> (states, parents,
    teacher rows, valid, copies), or None for a sequence without anchors."""
    copies = Copies(store, cfg.copy)
    if isinstance(base, BPDDrafter):
        positions = HeadPositions(store, base.config.num_heads)
        col = store.layer_slice(base.feature_layers)
        size = max(1, min(cfg.batch, len(positions.candidates)))
        return positions.candidates, size, lambda p, rng: heads_module_batch(base, store, positions, col, np.sort(p),
                                                                             copies)
    cols = store.layer_slice(base.feature_layers)
    seqs = [(a, b) for a, b in store.sequences() if b - a >= 8]

    def one_sequence(j, rng):
        a, b = seqs[int(j[0])]
        anchors = pick_anchors(store, a, b, cfg.anchors_per_seq, rng, base.config.gamma)
        return module_batch(base, store, a, b, cols, anchors, copies) if len(anchors) else None

    return np.arange(len(seqs)), 1, one_sequence


def one_pass(base, store: FeatureStore, cfg: "TreeFlashTrainConfig", rng, max_batches: int | None = None):
    """One shuffled pass of batches (at most `max_batches`), for validation."""
    items, size, make = batch_source(base, store, cfg)
    order = rng.permutation(items)
    n = 0
    for i in range(0, len(order) - size + 1, size):
        batch = make(order[i : i + size], rng)
        if batch is None:
            continue
        yield batch
        n += 1
        if max_batches is not None and n >= max_batches:
            return


def widen(module: ARApproxModule, inner_size: int, name: str = "the AR module") -> ARApproxModule:
    """The same function with `inner_size` hidden units (Net2Net-style), so that a fine-tune can add capacity
    without losing what the module learned: the added units get random gate/up rows scaled like the trained ones
    and zero columns in the down projection, so the output is unchanged until training moves them. Why: trained
    from scratch, a 3x wider module drafted held-out ShareGPT better (BENCHMARKS.md, "Decisions": treeflash module
    width), and retraining from scratch would give up the shipped modules' rounds of self-distillation."""
    n = module.config.inner_size
    if inner_size == n:
        return module
    if inner_size < n:
        raise BlockdraftError(f"--inner-size {inner_size} is narrower than {name}'s {n}: a fine-tune can widen a "
                              f"module, not narrow it")
    w = module.down.weight
    wide = ARApproxModule(replace(module.config, inner_size=inner_size)).to(w.device, w.dtype)
    with torch.no_grad():
        wide.norm_parent.weight.copy_(module.norm_parent.weight)
        wide.norm_state.weight.copy_(module.norm_state.weight)
        if module.norm_copy is not None:
            wide.norm_copy.weight.copy_(module.norm_copy.weight)
        for proj in ("gate", "up"):
            old, new = getattr(module, proj).weight, getattr(wide, proj).weight
            new[:n] = old
            new[n:] = torch.randn_like(new[n:]) * old.std()
        wide.down.weight.zero_()
        wide.down.weight[:, :n] = w
    return wide.train(module.training)


def steps_per_epoch(base, store: FeatureStore, cfg: "TreeFlashTrainConfig") -> int:
    items, size, _ = batch_source(base, store, cfg)
    return len(items) // size


def train_treeflash(target, store: FeatureStore, valid: FeatureStore | None, out, cfg: TreeFlashTrainConfig,
                    resume: bool = False) -> TreeFlashDrafter:
    if not cfg.init:
        raise BlockdraftError("--drafter treeflash trains on top of a dflash or bpd drafter: "
                              "pass --init DRAFTER_DIR")
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    base = load_base(cfg.init, target)
    if cfg.init_module:  # its weights in float32, its shape (or wider); the record keeps what it started from
        module = TreeFlashDrafter.from_pretrained(cfg.init_module, target, base).module.float().train()
        module = widen(module, cfg.inner_size or module.config.inner_size, cfg.init_module)
        module.config.block_drafter = str(cfg.init)
        if cfg.copy and not module.config.copy:
            raise BlockdraftError(f"--copy: '{cfg.init_module}' reads no copy tokens; train a new module with --copy")
        cfg = replace(cfg, copy=module.config.copy)  # a copy module is fine-tuned as one
    else:
        inner = cfg.inner_size or ARApproxConfig.inner_size
        module = ARApproxModule(ARApproxConfig(target.hidden_size, inner, block_drafter=str(cfg.init),
                                               base_kind=base.kind, copy=cfg.copy)).to(target.device)
    drafter = TreeFlashDrafter(base, module)
    t2d = base.lm_head.target_to_draft(target.vocab_size)
    depth = base.config.gamma - 1 if isinstance(base, DFlashDrafter) else base.config.num_heads
    weights = depth_weights(depth, depth)  # earlier depths weigh more
    steps = int(cfg.epochs * steps_per_epoch(base, store, cfg))
    evaluate = (lambda: evaluate_treeflash(drafter, valid, max_batches=40)) if valid is not None else None
    trainer = Trainer(module, out, cfg.lr, steps, cfg.max_minutes, resume=resume, desc="AR module",
                      evaluate=evaluate, stop_at_step=cfg.stop_at_step)
    module.train()
    items, size, make = batch_source(base, store, cfg)
    if not trainer.should_stop():
        for chosen in trainer.batches(items, size, rng):
            batch = make(chosen, rng)
            if batch is None:
                continue
            h, parents, rows, ok, copies = batch
            with mixed_precision(target):
                logits = base.lm_head(module(h, parent_embeddings(base, parents), copy_embeddings(base, copies)))
                loss = distill_loss(logits, Teacher.gather(store, rows, t2d), ok.float() * weights)
            if not trainer.step(loss):
                break
    trainer.close()
    module.eval()
    earlier = module.config.training
    module.config.training = trainer.record(cfg, store)
    if cfg.init_module:
        module.config.training["init_training"] = earlier
    if valid is not None:
        metrics = evaluate_treeflash(drafter, valid)
        module.config.training.update(valid_accuracy=[round(x, 4) for x in metrics.accuracy])
        print("with the true parent, " + metrics.summary())
    drafter.save_pretrained(out, target)
    return drafter


@torch.inference_mode()
def evaluate_treeflash(drafter: TreeFlashDrafter, store: FeatureStore, seed: int = 1,
                       max_batches: int | None = None) -> DraftMetrics:
    """Per-depth top-1 agreement given the true parent (what a tree can exploit), on held-out data."""
    base = drafter.base
    cfg = TreeFlashTrainConfig(anchors_per_seq=16, batch=256, copy=drafter.module.config.copy)
    metrics = DraftMetrics()
    for h, parents, rows, ok, copies in one_pass(base, store, cfg, np.random.default_rng(seed), max_batches):
        logits = base.lm_head(drafter.module(h, parent_embeddings(base, parents), copy_embeddings(base, copies)))
        draft = base.lm_head.to_target_ids(logits.argmax(-1))
        teacher_top1 = torch.from_numpy(np.asarray(store.topk_ids[rows.reshape(-1), 0], dtype=np.int64))
        metrics.add(draft, teacher_top1.view(rows.shape), ok)
    return metrics


TRAINING = (TreeFlashTrainConfig, train_treeflash)  # `blockdraft train --drafter treeflash`
