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

A module trained with `--copy` also reads RMSNorm(emb(c)), c the token that followed the parent's last
occurrence in the context (drafters/context_copy.py): what the drafter could not copy before.
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
from .checkpoint import load_checkpoint, load_weights, save_drafter
from .context_copy import NO_COPY, extend_table


# Transition rows over each depth's 128 likeliest marginal tokens, not the 8k draft vocabulary: drafting gets cheaper
# and, on held-out ShareGPT, tau did not fall (BENCHMARKS.md, "Decisions": columns)
COLUMNS = 128


@dataclass
class ARApproxConfig:
    hidden_size: int
    inner_size: int = 1152
    rms_eps: float = 1e-5
    block_drafter: str = ""  # the base drafter checkpoint it was trained on (for the record)
    base_kind: str = "dflash"  # the base drafter's checkpoint kind: "dflash" (TreeFlash) or "bpd" (Hydra-like)
    draft_vocab: int = 0
    copy: bool = False  # also reads the token after the parent's last occurrence in the context
    training: dict = field(default_factory=dict)


class ARApproxModule(nn.Module):
    """h + SwiGLU([RMSNorm(emb(parent)); RMSNorm(h)]) (with `copy`: and RMSNorm(emb(copy token)), zero where the
    parent has not occurred); the down projection starts at zero (identity)."""

    def __init__(self, c: ARApproxConfig):
        super().__init__()
        self.config = c
        h = c.hidden_size
        self.norm_parent = nn.RMSNorm(h, eps=c.rms_eps)
        self.norm_state = nn.RMSNorm(h, eps=c.rms_eps)
        self.norm_copy = nn.RMSNorm(h, eps=c.rms_eps) if c.copy else None
        inputs = (3 if c.copy else 2) * h
        self.gate = nn.Linear(inputs, c.inner_size, bias=False)
        self.up = nn.Linear(inputs, c.inner_size, bias=False)
        self.down = nn.Linear(c.inner_size, h, bias=False)
        nn.init.zeros_(self.down.weight)

    def forward(self, h: torch.Tensor, parent_emb: torch.Tensor, copy_emb: torch.Tensor | None = None
                ) -> torch.Tensor:
        parts = [self.norm_parent(parent_emb), self.norm_state(h)]
        if self.norm_copy is not None:
            parts.append(self.norm_copy(copy_emb))
        x = torch.cat(parts, -1)
        return h + self.down(F.silu(self.gate(x)) * self.up(x))


def token_embeddings(base, ids: torch.Tensor) -> torch.Tensor:
    """The target's input embeddings of `ids` (a base drafter's `embed`), zero where an id is NO_COPY."""
    ids = ids.to(base.embed.device)
    return base.embed[ids.clamp(min=0)] * (ids != NO_COPY).unsqueeze(-1).to(base.embed.dtype)


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
    # At T = 1 a wider support accepts more, paired at the same held-out contexts, for a little more drafting
    # (BENCHMARKS.md, "Decisions": sampled columns)
    SAMPLE_SUPPORT = 512

    name = "treeflash"
    kind = "treeflash"  # its checkpoints' kind: the module `train --drafter treeflash` makes (treeflash and hydra)
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
        self._copy_table, self._copy_seen = {}, 0  # with a copy module: token -> next token in this request
        self._to_draft = None  # target id -> draft id (a copy module's extra columns), built on first use

    @classmethod
    def from_pretrained(cls, folder, target, base: LatticeDrafter, **kw) -> "TreeFlashDrafter":
        config, state = load_checkpoint(folder, cls.kind, target)
        state.pop("draft_vocab", None)  # the base drafter's, recorded for the record
        cfg = ARApproxConfig(**{k: v for k, v in config.items() if k in ARApproxConfig.__dataclass_fields__})
        if cfg.base_kind != base.kind:
            raise BlockdraftError(f"the AR module '{folder}' was trained on a '{cfg.base_kind}' drafter, "
                                  f"not on a '{base.kind}' drafter")
        module = ARApproxModule(cfg)
        load_weights(module, state, folder, target)  # in the target's dtype, on its device
        return cls(base, module, vocab_size=target.vocab_size, **kw)

    def save_pretrained(self, folder, target) -> None:
        save_drafter(folder, self.kind, self.module, self.base.lm_head, target)

    def reset(self, prompt_ids) -> None:
        self.base.reset(prompt_ids)
        self._copy_table, self._copy_seen = {}, 0

    def _read_context(self, tokens: list[int]) -> None:
        if self.module.config.copy:
            if len(tokens) < self._copy_seen:  # another request without a reset: start over
                self._copy_table, self._copy_seen = {}, 0
            self._copy_table = extend_table(self._copy_table, tokens, self._copy_seen)
            self._copy_seen = len(tokens)

    def _copies(self, parents: torch.Tensor) -> torch.Tensor | None:
        """The copy input of each parent token (NO_COPY where it has not occurred), or None without a copy module."""
        if not self.module.config.copy:
            return None
        get = self._copy_table.get
        return torch.tensor([get(t, NO_COPY) for t in parents.reshape(-1).tolist()]).view(parents.shape)

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
                                  self._columns, self._copies(parents))
        return parents, tokens.cpu(), logp.cpu()

    @torch.inference_mode()
    def rows_for(self, tokens: list[int], depth: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        """Transition rows for parents that are not among the table's: the children at depth + 1 of nodes at
        `depth` holding `tokens` (token ids [n, width], log-probs [n, width]), as `transitions` computes them."""
        h = self.base.last_hidden[depth].expand(len(tokens), -1)
        columns = self._columns[depth] if self._columns is not None else None
        parents = torch.tensor(tokens)
        ids, logp = self._rows(h, parents, width, columns, self._copies(parents))
        return ids.cpu().numpy(), logp.cpu().numpy()

    def _rows(self, states: torch.Tensor, parents: torch.Tensor, width: int, columns: torch.Tensor | None = None,
              copies: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The module's top-`width` children (target token ids, log-probs) for base states [..., H] beside their
        parent tokens [...] (and, for a copy module, their copy tokens [...]).

        `columns` (draft ids [N], or [D, N] for states [D, M, H]) restricts the children to a depth's N likeliest
        marginal tokens: the LM head is read for N rows instead of the whole draft vocabulary (in the loop its
        weights come from memory each step), and the log-probs are normalised over those N (a copy module's rows
        add their copy token: the marginals rarely rank what the context repeats)."""
        head = self.base.lm_head
        emb = self.base.embed[parents.to(self.base.embed.device)]
        copy = None if copies is None else token_embeddings(self.base, copies).to(states.dtype)
        out = self.module(states, emb.to(states.dtype), copy)
        if columns is None:
            logits = head(out)
        else:
            logits = out @ head.weight[columns].transpose(-1, -2)
            columns = columns.unsqueeze(-2).expand(*logits.shape[:-1], -1)  # one row of draft ids per parent
            if copies is not None:
                columns, logits = self._copy_column(out, columns, logits, copies)
        top = torch.log_softmax(logits.float(), -1).topk(min(width, logits.shape[-1]), -1)
        ids = top.indices if columns is None else torch.take_along_dim(columns, top.indices, -1)  # -> draft ids
        return head.to_target_ids(ids), top.values

    def _copy_column(self, out: torch.Tensor, columns: torch.Tensor, logits: torch.Tensor, copies: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's columns [..., N] and logits with its copy token appended as column N + 1, at -inf where that
        token is outside the draft vocabulary or already a column."""
        head = self.base.lm_head
        if head.vocab is None:
            draft = copies.to(out.device)
        else:
            if self._to_draft is None:  # target id -> draft id, built once
                self._to_draft = head.target_to_draft(int(head.vocab.max()) + 1)
            ids = copies.to(out.device)
            inside = (ids >= 0) & (ids < len(self._to_draft))
            draft = torch.where(inside, self._to_draft[ids.clamp(0, len(self._to_draft) - 1)], NO_COPY)
        logit = (out * head.weight[draft.clamp(min=0)].to(out.dtype)).sum(-1)
        unusable = (draft < 0) | (columns == draft.unsqueeze(-1)).any(-1)
        logit = logit.masked_fill(unusable, float("-inf")).to(logits.dtype)
        return (torch.cat([columns, draft.clamp(min=0).unsqueeze(-1)], -1),
                torch.cat([logits, logit.unsqueeze(-1)], -1))

    def propose(self, ctx: DraftContext) -> DraftTree:
        tree, scores = self.scored_tree(ctx)
        return keep_best(tree, scores, self.cost_curve, len(ctx.tokens))

    def scored_tree(self, ctx: DraftContext) -> tuple[DraftTree, list[float]]:
        """The best-first tree under the budget, and each draft node's cumulative log-prob (best first)."""
        root = ctx.tokens[-1]
        self._read_context(ctx.tokens)
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
