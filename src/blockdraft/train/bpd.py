"""Training the BPD drafter's heads: each learns the target's distribution i+1 tokens ahead from one hidden state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from ..drafters.bpd import HEAD_STYLES, BPDConfig, BPDDrafter, BPDModel
from ..drafters.layers import FrozenLMHead
from .distill import Teacher, depth_weights, distill_loss
from .features import FeatureStore
from .metrics import DraftMetrics
from .precision import for_training, frozen_float32, mixed_precision
from .trainer import Trainer
from .vocab import DEFAULT_DRAFT_VOCAB, draft_vocabulary, grow_vocabulary


@dataclass
class BPDTrainConfig:
    styles: ClassVar[tuple[str, ...]] = HEAD_STYLES  # --style
    num_heads: int = 4
    inner_size: int = 1152
    draft_vocab: int | None = None  # None: 8192 for a new run, the checkpoint's with --init (which may grow it)
    epochs: float = 2.0
    lr: float = 1e-3
    batch: int = 256
    max_minutes: float = 0.0
    stop_at_step: int = 0
    seed: int = 0
    init: str | None = None  # start from this heads checkpoint (its heads and draft vocabulary): fine-tuning
    style: str = "ffn"  # head body (drafters.bpd.HEAD_STYLES); "medusa" is the one vLLM can load
    medusa_layers: int = 1


class HeadPositions:
    """Positions p whose state h_p trains the heads: head i's teacher is the target's distribution at p+i,
    which must lie in the same conversation and in a reply."""

    def __init__(self, store: FeatureStore, num_heads: int):
        self.store, self.k = store, num_heads
        starts = np.asarray(store.starts)
        n = len(store.tokens)
        self.assistant = np.asarray(store.assistant, dtype=bool)
        self.end = starts[np.searchsorted(starts, np.arange(n), side="right")]  # end of each position's sequence
        nxt = np.zeros(n, dtype=bool)
        nxt[:-1] = self.assistant[1:]
        self.candidates = np.nonzero(nxt & (np.arange(n) + 1 < self.end))[0]

    def batch(self, p: np.ndarray):
        """(rows [B, k] of teacher positions, valid [B, k])."""
        rows = p[:, None] + np.arange(1, self.k + 1)[None]
        inside = rows < self.end[p][:, None]
        rows = np.where(inside, rows, p[:, None])
        return rows, torch.from_numpy(inside & self.assistant[rows])


def heads_forward(model: BPDModel, lm_head: FrozenLMHead, store: FeatureStore, col: np.ndarray, p: np.ndarray):
    h = store.read(p, col, lm_head.weight.device)
    return lm_head(model(h))  # [B, k, V']


def train_bpd(target, store: FeatureStore, valid: FeatureStore | None, out, cfg: BPDTrainConfig,
              resume: bool = False) -> BPDDrafter:
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    final = store.layers[-1]
    if cfg.init:
        drafter = for_training(BPDDrafter.from_pretrained(cfg.init, target))
        model = drafter.model
        model.config.training = {"init": str(cfg.init), "init_training": model.config.training}
        grow_vocabulary(drafter, target, store, cfg.draft_vocab)
    else:  # float32 weights on the target's device; forward passes autocast to a bf16 target's dtype
        model = BPDModel(BPDConfig(target.hidden_size, final, cfg.num_heads, cfg.inner_size, style=cfg.style,
                                       medusa_layers=cfg.medusa_layers)).to(target.device)
        vocab = draft_vocabulary(store, DEFAULT_DRAFT_VOCAB if cfg.draft_vocab is None else cfg.draft_vocab,
                                 sorted(target.eos_token_ids))
        drafter = BPDDrafter(model, FrozenLMHead(frozen_float32(target.model.get_output_embeddings().weight), vocab),
                               embed=frozen_float32(target.model.get_input_embeddings().weight))
    cfg.num_heads = model.config.num_heads
    t2d = drafter.lm_head.target_to_draft(target.vocab_size)
    col = store.layer_slice((final,))
    positions = HeadPositions(store, cfg.num_heads)
    weights = depth_weights(cfg.num_heads, cfg.num_heads)
    steps = int(cfg.epochs * len(positions.candidates) / cfg.batch)
    evaluate = (lambda: evaluate_bpd(drafter, valid, limit=4096)) if valid is not None else None
    trainer = Trainer(model, out, cfg.lr, steps, cfg.max_minutes, resume=resume, desc="BPD heads", evaluate=evaluate,
                      stop_at_step=cfg.stop_at_step)
    model.train()
    if not trainer.should_stop():
        for p in trainer.batches(positions.candidates, cfg.batch, rng):
            p = np.sort(p)
            rows, ok = positions.batch(p)
            with mixed_precision(target):
                logits = heads_forward(model, drafter.lm_head, store, col, p)
                loss = distill_loss(logits, Teacher.gather(store, rows, t2d), ok.float() * weights)
            if not trainer.step(loss, positions_seen=(trainer.step_no + 1) * cfg.batch):
                break
    trainer.close()
    model.eval()
    model.config.training = {**model.config.training, **trainer.record(cfg, store)}
    if valid is not None:
        metrics = evaluate_bpd(drafter, valid)
        model.config.training.update(valid_accuracy=[round(x, 4) for x in metrics.accuracy],
                                     valid_tau_tf=round(metrics.tau, 3))
        print(metrics.summary())
    drafter.save_pretrained(out, target)
    return drafter


@torch.inference_mode()
def evaluate_bpd(drafter: BPDDrafter, store: FeatureStore, batch: int = 1024, limit: int | None = None
                   ) -> DraftMetrics:
    """Teacher-forced agreement of every head with the target on a held-out store (all positions, or an
    evenly spaced sample of `limit`)."""
    positions = HeadPositions(store, drafter.config.num_heads)
    col = store.layer_slice((drafter.config.feature_layer,))
    cand = positions.candidates
    if limit and len(cand) > limit:
        cand = cand[np.linspace(0, len(cand) - 1, limit).astype(int)]
    metrics = DraftMetrics()
    for i in range(0, len(cand), batch):
        p = cand[i : i + batch]
        rows, ok = positions.batch(p)
        logits = heads_forward(drafter.model, drafter.lm_head, store, col, p)
        draft = drafter.lm_head.to_target_ids(logits.argmax(-1))
        teacher_top1 = torch.from_numpy(np.asarray(store.topk_ids[rows.reshape(-1), 0], dtype=np.int64))
        metrics.add(draft, teacher_top1.view(rows.shape), ok)
    return metrics


TRAINING = (BPDTrainConfig, train_bpd)  # `blockdraft train --drafter bpd`: its options, its run
