"""Training the small neural rescoring LM: distil the target's next-token distributions over short windows."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..refine.neural import NeuralLM, NeuralLMConfig, NeuralRescorer
from .distill import Teacher, distill_loss
from .features import FeatureStore
from .metrics import DraftMetrics
from .precision import for_training, mixed_precision
from .trainer import Trainer
from .vocab import DEFAULT_DRAFT_VOCAB, draft_vocabulary


@dataclass
class NeuralTrainConfig:
    width: int = 256
    num_layers: int = 2
    window: int = 32
    draft_vocab: int = DEFAULT_DRAFT_VOCAB
    epochs: float = 1.0
    lr: float = 1e-3
    batch: int = 32
    max_minutes: float = 0.0
    stop_at_step: int = 0
    seed: int = 0


def windows(store: FeatureStore, window: int) -> np.ndarray:
    """Start offsets of every full window that lies inside one conversation and predicts some reply token."""
    starts = np.asarray(store.starts)
    out = []
    for a, b in zip(starts[:-1], starts[1:], strict=True):
        if b - a >= window:
            out.append(np.arange(a, b - window + 1, window // 2))
    s = np.concatenate(out) if out else np.zeros(0, np.int64)
    assistant = np.asarray(store.assistant)
    has_reply = np.array([assistant[i : i + window].any() for i in s], dtype=bool)
    return s[has_reply]


def window_batch(store: FeatureStore, embed: torch.Tensor, s: np.ndarray, window: int, t2d):
    rows = s[:, None] + np.arange(window)[None]
    tokens = torch.from_numpy(np.asarray(store.tokens[rows.reshape(-1)], dtype=np.int64)).view(rows.shape)
    valid = torch.from_numpy(np.asarray(store.assistant[rows.reshape(-1)], dtype=bool)).view(rows.shape)
    return embed[tokens.to(embed.device)], Teacher.gather(store, rows, t2d), valid


def train_neural(target, store: FeatureStore, valid: FeatureStore | None, out, cfg: NeuralTrainConfig,
                 resume: bool = False) -> NeuralRescorer:
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    # float32 weights on the target's device; forward passes autocast to a bf16 target's dtype
    model = NeuralLM(NeuralLMConfig(target.hidden_size, cfg.width, cfg.num_layers, window=cfg.window)).to(target.device)
    vocab = draft_vocabulary(store, cfg.draft_vocab, sorted(target.eos_token_ids))
    rescorer = for_training(NeuralRescorer.for_target(model, target, vocab))
    embed, head = rescorer.embed, rescorer.lm_head
    t2d = head.target_to_draft(target.vocab_size)
    starts = windows(store, cfg.window)
    steps = int(cfg.epochs * len(starts) / cfg.batch)
    evaluate = (lambda: evaluate_neural(rescorer, valid, limit=256)) if valid is not None else None
    trainer = Trainer(model, out, cfg.lr, steps, cfg.max_minutes, resume=resume, desc="neural rescorer",
                      evaluate=evaluate, stop_at_step=cfg.stop_at_step)
    model.train()
    if not trainer.should_stop():
        for s in trainer.batches(starts, cfg.batch, rng):
            emb, teacher, ok = window_batch(store, embed, s, cfg.window, t2d)
            with mixed_precision(target):
                loss = distill_loss(head(model(emb)), teacher, ok.float())
            if not trainer.step(loss, windows_seen=(trainer.step_no + 1) * cfg.batch):
                break
    trainer.close()
    model.eval()
    model.config.training = trainer.record(cfg, store)
    if valid is not None:
        metrics = evaluate_neural(rescorer, valid)
        model.config.training.update(valid_top1=round(metrics.accuracy[0], 4))
        print(f"held-out top-1 agreement with the target's next token: {metrics.accuracy[0]:.3f}")
    rescorer.save_pretrained(out, target)
    return rescorer


@torch.inference_mode()
def evaluate_neural(rescorer: NeuralRescorer, store: FeatureStore, limit: int | None = None) -> DraftMetrics:
    """Teacher-forced top-1 agreement of the rescorer with the target's next token on held-out windows."""
    w = rescorer.config.window
    starts = windows(store, w)
    if limit and len(starts) > limit:
        starts = starts[np.linspace(0, len(starts) - 1, limit).astype(int)]
    metrics = DraftMetrics()
    t2d = rescorer.lm_head.target_to_draft(rescorer.embed.shape[0])
    for i in range(0, len(starts), 64):
        s = starts[i : i + 64]
        emb, teacher, ok = window_batch(store, rescorer.embed, s, w, t2d)
        pred = rescorer.lm_head.to_target_ids(rescorer.lm_head(rescorer.model(emb)).argmax(-1))
        metrics.add(pred.reshape(-1, 1), teacher.top1.reshape(-1, 1), ok.reshape(-1, 1))
    return metrics


TRAINING = (NeuralTrainConfig, train_neural)  # `blockdraft train --drafter neural`
