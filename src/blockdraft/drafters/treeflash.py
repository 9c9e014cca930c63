"""TreeFlash: an AR-approximation module that makes a one-shot block drafter's depths parent-conditioned.

A block drafter gives each depth a *marginal* distribution: depth d does not know which token
was drafted at depth d-1. TreeFlash adds one small module per step,
    h'_d = h_d + SwiGLU([RMSNorm(emb(parent)); RMSNorm(h_d)])     (output projection zero-initialised)
read through the target's LM head, so that depth d's distribution is conditioned on a candidate
parent token. Drafting stays two passes, independent of depth: the block drafter once (marginals
-> the top-M parents per depth), then the module once over all M x (gamma-1) (parent, depth)
pairs (-> top-K children per parent: the transition tables). The tree builder then grows the
tree best-first over these tables. At initialisation the module is the identity, i.e. exactly
the block drafter's marginals.

The same module on top of BPD heads (their per-head states instead of the block's per-depth
states) makes the heads parent-conditioned, like Hydra's sequential heads: method `hydra`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..errors import BlockdraftError
from ..trees import DraftTree
from ..trees.budget import CostCurve, keep_best, node_budget
from ..trees.builders import best_first_transition_tree
from ..trees.sampled import drafting_generator, sampled_tree
from .base import DraftContext, Drafter, LatticeDrafter
from .checkpoint import drafter_kind, load_checkpoint, load_weights, save_drafter


# Transition rows over each depth's 128 likeliest marginal tokens, not the 8k draft vocabulary: on held-out ShareGPT
# (2026-12-03) hydra's drafting fell by ~0.45 ms a step, tau did not fall (hydra 1.99 -> 2.00, treeflash 1.97 -> 2.05)
COLUMNS = 128


@dataclass
class ARApproxConfig:
    hidden_size: int
    inner_size: int = 1152
    rms_eps: float = 1e-5
    block_drafter: str = ""  # the base drafter checkpoint it was trained on (for the record)
    base_kind: str = "dflash"  # the base drafter's checkpoint kind: "dflash" (TreeFlash) or "bpd" (Hydra-like)
    draft_vocab: int = 0
    training: dict = field(default_factory=dict)


class ARApproxModule(nn.Module):
    """h + SwiGLU([RMSNorm(emb(parent)); RMSNorm(h)]); the down projection starts at zero (identity)."""

    def __init__(self, c: ARApproxConfig):
        super().__init__()
        self.config = c
        h = c.hidden_size
        self.norm_parent = nn.RMSNorm(h, eps=c.rms_eps)
        self.norm_state = nn.RMSNorm(h, eps=c.rms_eps)
        self.gate = nn.Linear(2 * h, c.inner_size, bias=False)
        self.up = nn.Linear(2 * h, c.inner_size, bias=False)
        self.down = nn.Linear(c.inner_size, h, bias=False)
        nn.init.zeros_(self.down.weight)

    def forward(self, h: torch.Tensor, parent_emb: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.norm_parent(parent_emb), self.norm_state(h)], -1)
        return h + self.down(F.silu(self.gate(x)) * self.up(x))


class TreeFlashDrafter(Drafter):
    """Base drafter + AR module: best-first trees over parent-conditioned transition tables.

    The base is a block drafter or BPD heads: any lattice drafter that keeps its per-depth states
    (`last_hidden`), the target's input embeddings (`embed`) and its frozen LM head.

    `sample=True`: at T > 0 the best-first tree keeps its shape, and each node's children are drawn
    without replacement from its transition row (the module's distribution given the node's token, over
    its top SAMPLE_SUPPORT tokens, read over at least as many columns) at the decoder's temperature, with q
    reported for multi-draft rejection (trees/sampled.py). `draft_temp` scales the temperature the children
    are drawn at (1 = the decoder's): any q keeps the output exact, and a drafter whose distribution is
    flatter or sharper than the target's accepts more when drawn at another temperature.

    `columns=N`: the transition rows are read over each depth's N likeliest marginal tokens only (`_rows`; 0 = the
    whole draft vocabulary)."""

    # Tokens of each transition row a sampled child may be drawn from (a sampled step reads at least as many columns).
    # At T = 1, paired at the same contexts on held-out ShareGPT (BENCHMARKS.md, "Decisions"): 128 against
    # 32 tau +1.7% / +2.1% (711 / 1,040 steps; 64: +1.3%, 8: -7.9%), 512 against 128 +4.6% [+2.0%, +7.3%] (1,862)
    SAMPLE_SUPPORT = 512

    name = "treeflash"
    kind = "arapprox"
    wraps = ("base",)

    def __init__(self, base: LatticeDrafter, module: ARApproxModule, budget: int = 16, parents: int = 8,
                 children: int = 8, cost_curve: CostCurve | dict[int, float] | None = None, sample: bool = False,
                 vocab_size: int | None = None, draft_temp: float = 1.0, columns: int = COLUMNS):
        cost_curve = CostCurve.of(cost_curve)
        budget = node_budget(budget, cost_curve)  # budget 'auto': build to the curve's largest B, keep the best
        if parents < 1 or children < 1:
            raise BlockdraftError(f"parents and children must be at least 1, got {parents} and {children}")
        self.base, self.module = base, module.eval()
        self.budget, self.parents, self.children = budget, parents, children
        if sample and vocab_size is None:
            raise BlockdraftError("sampled TreeFlash trees need the target's vocabulary size")
        if not draft_temp > 0:
            raise BlockdraftError(f"draft_temp must be positive, got {draft_temp}")
        self.sample, self.vocab_size, self.draft_temp = sample, vocab_size, draft_temp
        if isinstance(columns, bool) or not isinstance(columns, int) or columns < 0:
            raise BlockdraftError(f"columns must be 0 (the whole draft vocabulary) or a positive number of tokens, "
                                  f"got {columns!r}")
        self.columns = columns
        self._columns = None  # this step's candidate columns per depth [D, columns] (draft ids), or None
        self.cost_curve = cost_curve
        self.feature_layers = base.feature_layers
        self.last_lattice = None

    @classmethod
    def from_pretrained(cls, folder, target, base: LatticeDrafter, **kw) -> "TreeFlashDrafter":
        config, state = load_checkpoint(folder, cls.kind, target)
        state.pop("draft_vocab", None)  # the base drafter's, recorded for the record
        cfg = ARApproxConfig(**{k: v for k, v in config.items() if k in ARApproxConfig.__dataclass_fields__})
        if drafter_kind(cfg.base_kind) != base.kind:  # modules trained before the rename say 'block' or 'heads'
            raise BlockdraftError(f"the AR module '{folder}' was trained on a '{cfg.base_kind}' drafter, "
                                  f"not on a '{base.kind}' drafter")
        module = ARApproxModule(cfg)
        load_weights(module, state, folder, target)  # in the target's dtype, on its device
        return cls(base, module, vocab_size=target.vocab_size, **kw)

    def save_pretrained(self, folder, target) -> None:
        save_drafter(folder, self.kind, self.module, self.base.lm_head, target)

    def reset(self, prompt_ids) -> None:
        self.base.reset(prompt_ids)

    def observe(self, ctx: DraftContext) -> None:
        self.base.observe(ctx)

    def lattice(self, ctx: DraftContext):
        return self.base.lattice(ctx)

    @torch.inference_mode()
    def transitions(self, root: int, lattice, width: int | None = None, columns: int | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(parents [D, M], child tokens [D, M, K], child log-probs [D, M, K]) with K = `width` (default:
        `children`), read over each depth's `columns` likeliest marginal tokens (default: the drafter's own
        `columns`); depth 0's only parent is the root."""
        columns = self.columns if columns is None else columns
        D = lattice.depth
        M = min(self.parents, lattice.tokens.shape[1])
        parents = torch.cat([torch.full((1, M), root), lattice.tokens[: D - 1, :M]])  # [D, M], on the CPU
        logits = getattr(self.base, "last_logits", None)
        vocab = self.base.lm_head.weight.shape[0]
        self._columns = (logits[:D].topk(columns, -1).indices if columns and logits is not None
                         and columns < vocab else None)
        # the tables (D x M x K ids and log-probs) go to the CPU once, for the Python tree builder
        tokens, logp = self._rows(self.base.last_hidden[:D, None].expand(D, M, -1), parents, width or self.children,
                                  self._columns)
        return parents, tokens.cpu(), logp.cpu()

    @torch.inference_mode()
    def rows_for(self, tokens: list[int], depth: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        """Transition rows for parents that are not among the table's: the children at depth + 1 of nodes at
        `depth` holding `tokens` (token ids [n, width], log-probs [n, width]), as `transitions` computes them."""
        h = self.base.last_hidden[depth].expand(len(tokens), -1)
        columns = self._columns[depth] if self._columns is not None else None
        ids, logp = self._rows(h, torch.tensor(tokens), width, columns)
        return ids.cpu().numpy(), logp.cpu().numpy()

    def _rows(self, states: torch.Tensor, parents: torch.Tensor, width: int, columns: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """The module's top-`width` children (target token ids, log-probs) for base states [..., H] beside their
        parent tokens [...].

        `columns` (draft ids [N], or [D, N] for states [D, M, H]) restricts the children to a depth's N likeliest
        marginal tokens: the LM head is read for N rows instead of the whole draft vocabulary (in the loop its
        weights come from memory each step), and the log-probs are normalised over those N."""
        head = self.base.lm_head
        emb = self.base.embed[parents.to(self.base.embed.device)]
        out = self.module(states, emb.to(states.dtype))
        logits = head(out) if columns is None else out @ head.weight[columns].transpose(-1, -2)
        top = torch.log_softmax(logits.float(), -1).topk(min(width, logits.shape[-1]), -1)
        ids = top.indices if columns is None else torch.take_along_dim(
            columns.unsqueeze(-2).expand(*top.indices.shape[:-1], -1), top.indices, -1)  # -> draft ids
        return head.to_target_ids(ids), top.values

    def propose(self, ctx: DraftContext) -> DraftTree:
        tree, scores = self.scored_tree(ctx)
        return keep_best(tree, scores, self.cost_curve, len(ctx.tokens))

    def scored_tree(self, ctx: DraftContext) -> tuple[DraftTree, list[float]]:
        """The best-first tree under the budget, and each draft node's cumulative log-prob (best first)."""
        root = ctx.tokens[-1]
        lattice = self.lattice(ctx)
        self.last_lattice = lattice
        if lattice is None:
            return DraftTree.root_only(root), []
        sample = self.sample and ctx.temperature > 0
        width = max(self.children, self.SAMPLE_SUPPORT) if sample else self.children
        columns = self.columns and max(self.columns, width)  # a sampled row draws from its whole support (0: all)
        parents, tokens, logp = self.transitions(root, lattice, width, columns)
        scores: list[float] = []
        tree = best_first_transition_tree(root, lattice, parents, tokens[..., : self.children],
                                          logp[..., : self.children], self.budget, ctx.max_depth, scores)
        if sample:  # the same shape (only the nodes that will be sent), its children drawn from the wider rows
            tree = keep_best(tree, scores, self.cost_curve, len(ctx.tokens))
            tree, scores = sampled_tree(tree, scores[: len(tree) - 1], lattice, ctx.temperature * self.draft_temp,
                                        drafting_generator(ctx), self.vocab_size, parents, tokens, logp,
                                        lambda ids, depth: self.rows_for(ids, depth, tokens.shape[-1]))
        return tree, scores
