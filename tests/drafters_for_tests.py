"""Drafters that exist only to stress the verifier (random trees, sampled chains with real q) or the server."""

from __future__ import annotations

import torch

from blockdraft import DraftTree, Drafter
from blockdraft.drafters import PromptLookupDrafter


class RandomTreeDrafter(Drafter):
    """Proposes a random tree of random tokens: mostly wrong, sometimes right, any shape."""

    name = "random-tree"

    def __init__(self, vocab_size: int, max_nodes: int = 8, seed: int = 0, favour: list[int] | None = None):
        self.vocab_size, self.max_nodes = vocab_size, max_nodes
        self.gen = torch.Generator().manual_seed(seed)
        self.favour = favour  # tokens drawn more often, so that some drafts get accepted

    def _token(self) -> int:
        if self.favour and torch.rand((), generator=self.gen) < 0.5:
            return self.favour[int(torch.randint(len(self.favour), (), generator=self.gen))]
        return int(torch.randint(self.vocab_size, (), generator=self.gen))

    def propose(self, ctx):
        n = int(torch.randint(1, self.max_nodes + 1, (), generator=self.gen))
        tokens, parents = [ctx.tokens[-1]], [-1]
        for i in range(1, n):
            parents.append(int(torch.randint(i, (), generator=self.gen)))
            tokens.append(self._token())
        return DraftTree(torch.tensor(tokens), torch.tensor(parents))


class SampledChainDrafter(Drafter):
    """Samples a chain from a fixed random distribution q and reports q, for rejection sampling."""

    name = "sampled-chain"

    def __init__(self, vocab_size: int, length: int = 3, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.q = torch.softmax(2 * torch.randn(length, vocab_size, generator=g), -1)
        self.gen = torch.Generator().manual_seed(seed + 1)

    def propose(self, ctx):
        draft = torch.multinomial(self.q, 1, generator=self.gen).reshape(-1)
        return DraftTree.chain(ctx.tokens[-1], draft, self.q)


class SampledTreeDrafter(Drafter):
    """Samples each node's children i.i.d. from q[depth] and reports q: rejection sampling's premise, on trees.

    `widths[d]` children hang under every node at depth d (duplicate siblings allowed), so the tree
    always reaches depth len(widths); widths (1, 1, 1) is a chain.
    """

    name = "sampled-tree"

    def __init__(self, q: torch.Tensor, widths: tuple[int, ...], seed: int = 0):
        self.q, self.widths = q, widths
        self.gen = torch.Generator().manual_seed(seed)

    def propose(self, ctx):
        tokens, parents, rows = [ctx.tokens[-1]], [-1], [torch.full_like(self.q[0], float("nan"))]
        level = [0]
        for d, width in enumerate(self.widths):
            below = []
            for node in level:
                for tok in torch.multinomial(self.q[d], width, replacement=True, generator=self.gen).tolist():
                    below.append(len(tokens))
                    tokens.append(tok)
                    parents.append(node)
                    rows.append(self.q[d])
            level = below
        return DraftTree(torch.tensor(tokens), torch.tensor(parents), torch.stack(rows))


class KnownAcceptanceDrafter(Drafter):
    """Drafts the target's own greedy continuation for `right` tokens, then a wrong token.

    Under greedy verification every step accepts exactly `right` drafts (fewer only where the
    token budget cuts the tree), so tau and the acceptance histogram can be counted by hand.
    """

    name = "known-acceptance"

    def __init__(self, model, right: int):
        self.model, self.right = model, right

    @torch.no_grad()
    def propose(self, ctx):
        seq = list(ctx.tokens)
        for _ in range(self.right + 1):
            seq.append(int(self.model(torch.tensor([seq])).logits[0, -1].argmax()))
        draft = seq[len(ctx.tokens):]
        draft[-1] = (draft[-1] + 1) % self.model.config.vocab_size  # not what the target wants
        return DraftTree.chain(ctx.tokens[-1], draft)


class FailingDrafter(PromptLookupDrafter):
    """Prompt lookup that raises at one stage of a generation: `fork` (the server admitting a request), `reset`
    (after the prompt's prefill) or `propose` (at its `after`+1-th step), to prove one request's failure is its own."""

    def __init__(self, stage: str, after: int = 2):
        self.stage, self.after, self.proposed = stage, after, 0  # before the base's __init__, which resets
        super().__init__()

    def fork(self) -> "FailingDrafter":
        if self.stage == "fork":
            raise RuntimeError("simulated fork failure")
        return super().fork()

    def reset(self, prompt_ids) -> None:
        if self.stage == "reset" and prompt_ids:  # (the base's __init__ resets with no prompt)
            raise RuntimeError("simulated reset failure")
        super().reset(prompt_ids)
        self.proposed = 0

    def propose(self, ctx):
        self.proposed = self.proposed + 1  # assigned anew, never mutated: forks keep their own count
        if self.stage == "propose" and self.proposed > self.after:
            raise RuntimeError("simulated propose failure")
        return super().propose(ctx)
