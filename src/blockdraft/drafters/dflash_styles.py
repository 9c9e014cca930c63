"""The DFlash drafter's two architectures ("styles"): ours ("seeded") and the one vLLM runs ("vllm").

Both draft a block [root, MASK x (gamma-1)] that attends to the projected target context; they differ in
what the block's inputs carry and in small architectural details, each a method of its style here:

- "seeded" (ours, the default): every block position also gets the root's embedding, the projected last
  context state and (with `final_state_residual`) the target's final state, plus one learned MASK embedding
  per depth; features are centred and scaled. Why: a freshly initialised drafter spreads its attention
  over hundreds of context keys, and in a CPU-sized training budget it never learned to find them
  (depth-1 agreement stayed near the unigram level, 5-9%, after 30k blocks); the final state is what the
  frozen LM head reads, so the drafter starts, like Medusa heads, from the target's own prediction.
- "vllm": the architecture vLLM's DFlashDraftModel runs (vllm/model_executor/models/qwen3_dflash.py), so
  that `blockdraft export --to vllm` can write it exactly: per-head RMSNorm on queries and keys, block
  inputs that are plain embeddings [root, MASK x (gamma-1)] with MASK the target's own embedding of
  `mask_token_id`, features scaled but not centred, no final-state feature.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import BlockdraftError



class Seeded:
    """Ours: block inputs seeded with the root, the last context state and the final state; learned MASKs."""

    name = "seeded"
    qk_norm = False  # no per-head query/key norm
    final_state = True  # the target's final normed state may be a feature (added to every block input)

    def check(self, c) -> None:
        pass

    def context_layers(self, layers: tuple[int, ...], num_layers: int) -> tuple[int, ...]:
        """The store's feature layers this style reads: all of them, the final normed state included."""
        return layers

    def add_parameters(self, model, c) -> None:
        """One learned MASK embedding per depth; with `zero_init`, a Medusa-style start (see DFlashConfig)."""
        model.mask_embedding = nn.Parameter(torch.randn(c.gamma - 1, c.hidden_size) * 0.02)
        if c.zero_init:
            model.input_gate = nn.Parameter(torch.zeros(1))
            with torch.no_grad():
                model.mask_embedding.zero_()
                for layer in model.layers:
                    layer.o_proj.weight.zero_()
                    layer.down_proj.weight.zero_()

    def set_feature_stats(self, model, mean: torch.Tensor, std: torch.Tensor) -> None:
        model.feature_mean.copy_(mean)
        model.feature_scale.copy_(1.0 / std.clamp_min(1e-3))

    def init_from_target(self, model, body) -> None:
        """The MASK embeddings start as the target's mean embedding."""
        model.mask_embedding.copy_(body.embed_tokens.weight.mean(0).expand_as(model.mask_embedding))

    def block_inputs(self, model, root_emb: torch.Tensor, last_features: torch.Tensor, mask_emb) -> torch.Tensor:
        """Position 0 is the root, positions 1.. are MASK (one learned embedding per depth); every position
        also gets the root's embedding, the projected last context state and, with `final_state_residual`,
        the target's final hidden state there (the module docstring says why)."""
        c = model.config
        shared = root_emb + model.project(last_features)
        if c.zero_init:
            shared = shared * model.input_gate
        if c.final_state_residual:
            shared = shared + last_features[:, -c.hidden_size :]
        shared = shared[:, None]
        first = torch.zeros_like(model.mask_embedding[:1])
        return shared + torch.cat([first, model.mask_embedding])[None]


class Vllm:
    """vLLM's DFlashDraftModel: QK-norm, plain embeddings with the target's MASK token, scaled features."""

    name = "vllm"
    qk_norm = True  # Qwen3's QK-norm, which vLLM's DFlash attention always applies
    final_state = False

    def check(self, c) -> None:
        if c.final_state_residual or c.zero_init:
            raise BlockdraftError("the 'vllm' DFlash style takes no extra block inputs (final_state_residual, "
                                  "zero_init)")

    def context_layers(self, layers: tuple[int, ...], num_layers: int) -> tuple[int, ...]:
        """Residual-stream layers only: vLLM hands a drafter no final normed state."""
        return tuple(lay for lay in layers if lay < num_layers)

    def add_parameters(self, model, c) -> None:
        pass  # the MASK input is the target's own (frozen) embedding of mask_token_id

    def set_feature_stats(self, model, mean: torch.Tensor, std: torch.Tensor) -> None:
        # Scale only, by the per-dimension RMS: vLLM's fc has no bias, so a subtracted mean could not be
        # exported, while a scale folds into fc's columns exactly (export/vllm.py).
        model.feature_mean.zero_()
        model.feature_scale.copy_(1.0 / (mean.square() + std.square()).sqrt().clamp_min(1e-3))

    def init_from_target(self, model, body) -> None:
        pass

    def block_inputs(self, model, root_emb: torch.Tensor, last_features: torch.Tensor, mask_emb) -> torch.Tensor:
        """DFlash's own inputs: [root embedding, mask_emb x (gamma-1)], mask_emb [H] the target's embedding of
        mask_token_id; depths differ by position only, context comes by attention."""
        masks = mask_emb.to(root_emb.dtype).expand(len(root_emb), model.config.gamma - 1, -1)
        return torch.cat([root_emb[:, None], masks], 1)


STYLES = {s.name: s for s in (Seeded(), Vllm())}


def style_name(name: str) -> str:
    """`name`, checked: unknown names are refused."""
    if name not in STYLES:
        raise BlockdraftError(f"unknown DFlash style '{name}': choose one of {', '.join(STYLES)}")
    return name
