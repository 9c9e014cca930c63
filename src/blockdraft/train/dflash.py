"""Training the DFlash drafter: many anchor blocks per sequence in one pass, distilled from the target."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from ..drafters.dflash import DFlashDrafter
from ..drafters.dflash_model import DFlashConfig, DFlashModel
from ..drafters.dflash_styles import STYLES, style_name
from ..drafters.layers import FrozenLMHead
from ..errors import BlockdraftError
from .distill import Teacher, depth_weights, distill_loss
from .features import FeatureStore
from .metrics import DraftMetrics
from .precision import for_training, mixed_precision
from .trainer import Trainer
from .vocab import DEFAULT_DRAFT_VOCAB, draft_vocabulary, grow_vocabulary


@dataclass
class DFlashTrainConfig:
    styles: ClassVar[tuple[str, ...]] = tuple(STYLES)  # --style
    num_layers: int = 2
    gamma: int = 8
    draft_vocab: int | None = None  # None: 8192 for a new run, the checkpoint's with --init (which may grow it)
    epochs: float = 1.0
    lr: float = 1e-3
    anchors_per_seq: int = 0  # 0: one per gamma - 1 reply positions (an epoch trains each reply token ~once)
    seqs_per_step: int = 1
    max_minutes: float = 0.0
    stop_at_step: int = 0
    init_from_target: bool = False
    zero_init: bool = False
    seed: int = 0
    style: str = "seeded"  # drafters.dflash_styles.STYLES; "vllm" is the one vLLM can load
    mask_token_id: int | None = None  # style "vllm" (default: default_mask_token)
    init: str | None = None  # start from this DFlash drafter (its architecture, layers, statistics, vocabulary)


def default_mask_token(target) -> int:
    """DFlash's MASK input for a target without a mask token of its own: its unknown token when that is not
    an end of turn (SmolLM2: 0, <|endoftext|>, which chat replies hardly ever contain), else the last id. The
    choice can only cost acceptance (verification keeps the output exact): the root's input is its own
    embedding either way."""
    unk = target.tokenizer.unk_token_id
    return unk if unk is not None and unk not in target.eos_token_ids else target.vocab_size - 1


def block_batch(store: FeatureStore, a: int, b: int, cols: np.ndarray, gamma: int, anchors: np.ndarray,
                device: torch.device | str = "cpu"):
    """Inputs for all anchor blocks of one sequence [a, b): features, block tokens/positions, mask, teachers
    (the model's inputs on `device`; teacher rows and validity stay on the CPU).

    Block i starts at anchor p_i (the "last accepted token"): it sees target features of positions
    < p_i, its own gamma positions (non-causally), and nothing of the other blocks. Its position j
    (1..gamma-1) is trained towards the target's distribution at p_i + j - 1, i.e. for token p_i + j.
    """
    t = b - a
    feats = store.read(slice(a, b), cols, device)
    n_blk = len(anchors) * gamma
    starts = torch.from_numpy(anchors).to(device)
    pos = starts[:, None] + torch.arange(gamma, device=device)[None]  # [A, g]
    # the mask is built where it is used: [A * g, t + A * g] booleans are megabytes a step to copy to a GPU
    allowed = torch.zeros(n_blk, t + n_blk, dtype=torch.bool, device=device)
    allowed[:, :t] = torch.arange(t, device=device)[None] < starts.repeat_interleave(gamma)[:, None]
    blk = torch.arange(n_blk, device=device) // gamma
    allowed[:, t:] = blk[:, None] == blk[None]
    rows = (anchors[:, None] + np.arange(gamma - 1)[None]).clip(max=t - 1)  # teacher rows, within the sequence
    valid = (anchors[:, None] + np.arange(gamma - 1)[None] < t) & (np.asarray(store.assistant[a:b])[rows] == 1)
    roots = torch.from_numpy(np.asarray(store.tokens[a:b])[anchors].astype(np.int64)).to(device)
    return feats, roots, pos, allowed, rows + a, torch.from_numpy(valid)


def block_forward(model: DFlashModel, embed: torch.Tensor, lm_head: FrozenLMHead, feats, roots, pos, allowed):
    """Logits [A, gamma-1, V'] of every anchor block of one sequence."""
    return lm_head(block_hidden(model, embed, feats, roots, pos, allowed))


def block_hidden(model: DFlashModel, embed: torch.Tensor, feats, roots, pos, allowed):
    """Final states [A, gamma-1, H] of the drafted positions of every anchor block of one sequence."""
    g = pos.shape[1]
    ctx_h = model.project(feats)
    anchors = pos[:, 0]
    last = torch.where((anchors > 0)[:, None], feats[(anchors - 1).clamp_min(0)], model.feature_mean[None])
    x = model.block_inputs(embed[roots], last, embed[model.config.mask_token_id])
    ctx = model.context(ctx_h, torch.arange(len(feats), device=feats.device))
    h = model(x.reshape(-1, x.shape[-1]), pos.reshape(-1), ctx, allowed)
    return h.view(len(roots), g, -1)[:, 1:]


AUTO_ANCHORS = 128


def pick_anchors(store: FeatureStore, a: int, b: int, k: int, rng: np.random.Generator, gamma: int = 8) -> np.ndarray:
    """`k` random reply positions of sequence [a, b) to start blocks at; k = 0: one per gamma - 1 of them,
    so that the blocks' trained positions cover the replies about once (long conversations get more, up
    to AUTO_ANCHORS: the dense block mask's cost grows with anchors x context)."""
    cand = np.nonzero(np.asarray(store.assistant[a : b - 1]))[0]
    if len(cand) == 0:
        return cand
    k = k or min(AUTO_ANCHORS, -(-len(cand) // (gamma - 1)))
    return np.sort(rng.choice(cand, size=min(k, len(cand)), replace=False))


def new_dflash_drafter(target, store: FeatureStore, cfg: DFlashTrainConfig):
    """(drafter, model, its config, feature layers) for a fresh DFlash drafter on `store`'s layers."""
    style = STYLES[style_name(cfg.style)]
    # spaced layers for the context, then the final normed state (which the "vllm" style leaves out)
    layers = style.context_layers(tuple(store.layers), target.num_layers)
    if not layers:
        raise BlockdraftError(f"the feature store {store.path} has no layer below the final one ({store.layers})")
    final = style.final_state and layers[-1] == target.num_layers  # then added to every block input
    mask_id = default_mask_token(target) if cfg.mask_token_id is None else cfg.mask_token_id
    model_cfg = DFlashConfig.for_target(target, layers, num_layers=cfg.num_layers, gamma=cfg.gamma,
                                        final_state_residual=final, zero_init=cfg.zero_init and final,
                                        style=style.name, mask_token_id=mask_id)
    model = DFlashModel(model_cfg)
    if cfg.init_from_target:
        model.init_from_target(target.model)
    sample = store.feature_sample(store.layer_slice(layers))
    model.set_feature_stats(torch.from_numpy(sample.mean(0)), torch.from_numpy(sample.std(0)))
    model.float().to(target.device)  # float32 weights; forward passes autocast to a bf16 target's dtype
    vocab = draft_vocabulary(store, DEFAULT_DRAFT_VOCAB if cfg.draft_vocab is None else cfg.draft_vocab,
                             sorted(target.eos_token_ids))
    drafter = for_training(DFlashDrafter.for_target(model, target, vocab))
    return drafter, model, model_cfg, layers


def train_dflash(target, store: FeatureStore, valid: FeatureStore | None, out, cfg: DFlashTrainConfig,
                 resume: bool = False) -> DFlashDrafter:
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    if cfg.init:
        drafter = for_training(DFlashDrafter.from_pretrained(cfg.init, target))
        model, model_cfg = drafter.model, drafter.model.config
        earlier, layers, cfg.gamma = model_cfg.training, tuple(model_cfg.feature_layers), model_cfg.gamma
        grow_vocabulary(drafter, target, store, cfg.draft_vocab)
        if not set(layers) <= set(store.layers):
            raise BlockdraftError(f"--init {cfg.init} reads target layers {layers}; the feature store {store.path} "
                                  f"holds {tuple(store.layers)}")
    else:
        drafter, model, model_cfg, layers = new_dflash_drafter(target, store, cfg)
        earlier = None
    t2d = drafter.lm_head.target_to_draft(target.vocab_size)
    cols = store.layer_slice(layers)
    weights = depth_weights(cfg.gamma - 1, cfg.gamma)
    seqs = [(a, b) for a, b in store.sequences() if b - a >= 8]
    steps = int(cfg.epochs * len(seqs) / cfg.seqs_per_step)
    evaluate = (lambda: evaluate_dflash(drafter, valid, cols, max_seqs=40)) if valid is not None else None
    trainer = Trainer(model, out, cfg.lr, steps, cfg.max_minutes, resume=resume, desc="DFlash drafter",
                      evaluate=evaluate, stop_at_step=cfg.stop_at_step)
    model.train()
    if not trainer.should_stop():
        for group in trainer.batches(np.arange(len(seqs)), cfg.seqs_per_step, rng):
            total, n_anchors = None, 0
            for j in group:
                a, b = seqs[j]
                anchors = pick_anchors(store, a, b, cfg.anchors_per_seq, rng, cfg.gamma)
                if len(anchors) == 0:
                    continue
                feats, roots, pos, allowed, rows, ok = block_batch(store, a, b, cols, cfg.gamma, anchors,
                                                                   target.device)
                with mixed_precision(target):
                    logits = block_forward(model, drafter.embed, drafter.lm_head, feats, roots, pos, allowed)
                    teacher = Teacher.gather(store, rows, t2d)
                    loss = distill_loss(logits, teacher, ok.float() * weights) / cfg.seqs_per_step
                total = loss if total is None else total + loss
                n_anchors += len(anchors)
            if total is None:  # no reply position in these sequences
                continue
            seen = trainer.counters["anchors_seen"] = trainer.counters.get("anchors_seen", 0) + n_anchors
            if not trainer.step(total, anchors_seen=seen):
                break
    trainer.close()
    model.eval()
    model_cfg.training = trainer.record(cfg, store)
    if cfg.init:
        model_cfg.training["init_training"] = earlier
    if valid is not None:
        metrics = evaluate_dflash(drafter, valid, cols)
        model_cfg.training.update(valid_accuracy=[round(x, 4) for x in metrics.accuracy],
                                  valid_tau_tf=round(metrics.tau, 3))
        print(metrics.summary())
    drafter.save_pretrained(out, target)
    return drafter


@torch.inference_mode()
def evaluate_dflash(drafter: DFlashDrafter, store: FeatureStore, cols: np.ndarray, anchors_per_seq: int = 16,
                   seed: int = 1, max_seqs: int | None = None) -> DraftMetrics:
    """Teacher-forced agreement with the target on a held-out store (fixed anchors, so runs compare)."""
    rng = np.random.default_rng(seed)
    metrics = DraftMetrics()
    g = drafter.config.gamma
    for a, b in list(store.sequences())[:max_seqs]:
        anchors = pick_anchors(store, a, b, anchors_per_seq, rng)
        if len(anchors) == 0:
            continue
        feats, roots, pos, allowed, rows, ok = block_batch(store, a, b, cols, g, anchors, drafter.embed.device)
        logits = block_forward(drafter.model, drafter.embed, drafter.lm_head, feats, roots, pos, allowed)
        draft = drafter.lm_head.to_target_ids(logits.argmax(-1))
        teacher_top1 = torch.from_numpy(np.asarray(store.topk_ids[rows.reshape(-1), 0], dtype=np.int64))
        metrics.add(draft, teacher_top1.view(rows.shape), ok)
    return metrics


TRAINING = (DFlashTrainConfig, train_dflash)  # `blockdraft train --drafter dflash`: its options, its run
