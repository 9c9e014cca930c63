"""transformers' own forward with a DynamicCache: the engine for any causal LM the static engine does not cover."""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache


class HFForward:
    """The same protocol as `StaticEngine` (reset / forward / commit), through `model(...)`.

    Tree passes use a 4D additive mask and explicit position ids; a commit keeps the accepted
    path's KV entries (moved next to the prefix when the path is not the first nodes) and slices
    the rest off.
    """

    def __init__(self, model):
        self.model = model
        self.cache: DynamicCache | None = None
        self.length = 0
        # transformers renamed `past_key_values` to `cache` in 5.x; pass whichever this version takes.
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.length = 0

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor | None = None,
                hidden_layers: tuple[int, ...] = (), last_logits_only: bool = False):
        n, start = tokens.shape[0], self.length
        mask = None  # causal: transformers builds it itself
        if allowed is not None:
            dtype = self.model.dtype
            full = torch.ones(n, start + n, dtype=torch.bool, device=tokens.device)
            full[:, start:] = allowed
            mask = torch.zeros(1, 1, n, start + n, dtype=dtype, device=tokens.device)
            mask.masked_fill_(~full, torch.finfo(dtype).min)
        out = self.model(
            input_ids=tokens.unsqueeze(0),
            position_ids=positions.unsqueeze(0),
            attention_mask=mask,
            use_cache=True,
            logits_to_keep=1 if last_logits_only else 0,
            output_hidden_states=bool(hidden_layers),
            **{self._cache_kw: self.cache},
        )
        self.length = start + n
        hidden = [out.hidden_states[i][0] for i in hidden_layers] if hidden_layers else []
        return out.logits[0], hidden

    @torch.inference_mode()
    def commit(self, start: int, path: list[int]) -> None:
        m = len(path)
        contiguous = path == list(range(m))
        for layer in self.cache.layers:
            if not contiguous:  # move the accepted entries next to the committed prefix
                src = torch.tensor(path, device=layer.keys.device) + start
                layer.keys[..., start : start + m, :] = layer.keys.index_select(-2, src)
                layer.values[..., start : start + m, :] = layer.values.index_select(-2, src)
            layer.keys = layer.keys[..., : start + m, :]
            layer.values = layer.values[..., : start + m, :]
        self.length = start + m
