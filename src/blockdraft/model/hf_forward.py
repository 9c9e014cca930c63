"""transformers' own forward on a full-length cache: the engine for every causal LM the static engine does not cover."""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache

from ..errors import BlockdraftError

# Attention layers whose KV entries a commit can keep or drop position by position. Anything else (recurrent,
# convolutional or linear-attention state, chunked attention, layers that reuse another layer's cache) folds
# every token it sees into a state that a rejected draft cannot be taken out of: such a model is refused.
ATTENTION_TYPES = ("full_attention", "sliding_attention")
# Model types whose cache is not a per-position KV cache even though their configs declare no layer types.
RECURRENT_TYPES = ("mamba", "mamba2", "falcon_mamba", "rwkv", "xlstm", "recurrent_gemma", "jamba", "zamba",
                   "zamba2", "bamba", "falcon_h1", "nemotron_h", "lfm2", "lfm2_moe", "granitemoehybrid",
                   "qwen3_next", "kimi_linear", "minimax")
# Model types whose attention reads a key's place in the cache as its position: ALiBi biases built from the key's
# index (a tree node's index is not its position), GPT-Neo's local layers windowed by index. Refused, since a
# tree pass would give them other logits than plain decoding.
INDEX_POSITIONED = {"bloom": "ALiBi biases from each key's index in the cache",
                    "mpt": "ALiBi biases from each key's index in the cache"}


def layer_windows(config) -> list[int | None]:
    """Each decoder layer's sliding window (None: full attention), as transformers' cache reads the config.

    Raises BlockdraftError for a model with a layer blockdraft cannot roll back."""
    text = config.get_text_config(decoder=True)
    model_type = getattr(text, "model_type", None) or config.model_type
    if model_type in RECURRENT_TYPES or config.model_type in RECURRENT_TYPES:
        raise BlockdraftError(f"'{config.model_type}' models keep a recurrent state that a rejected draft cannot be "
                              "rolled back from: blockdraft cannot verify them exactly")
    reason = INDEX_POSITIONED.get(config.model_type)
    if config.model_type == "falcon" and getattr(config, "alibi", False):
        reason = INDEX_POSITIONED["bloom"]
    if config.model_type == "gpt_neo" and "local" in getattr(config, "attention_layers", ()):
        reason = "local attention layers windowed by each key's index in the cache"
    if reason:
        raise BlockdraftError(f"'{config.model_type}' models use {reason}, not its position: a draft tree's nodes "
                              "would see other positions than plain decoding, so blockdraft cannot verify them exactly")
    refuse_inconsistent_latent_attention(text)
    try:  # transformers' own reading of the config (layer_types, or sliding_window / attention_chunk_size)
        from transformers.cache_utils import get_layer_types_and_kwargs

        types, kwargs = get_layer_types_and_kwargs(text)
    except (ImportError, AttributeError):
        window = getattr(text, "sliding_window", None)
        types = getattr(text, "layer_types", None) or (
            ["sliding_attention" if window else "full_attention"] * text.num_hidden_layers)
        kwargs = [{"sliding_window": window} if t == "sliding_attention" else {} for t in types]
    unknown = sorted(set(types) - set(ATTENTION_TYPES))
    if unknown:
        raise BlockdraftError(f"'{config.model_type}' has layers of type {', '.join(unknown)}, whose cache a rejected "
                              "draft cannot be taken out of: blockdraft verifies only full and sliding-window "
                              "attention layers")
    return [k.get("sliding_window") if t == "sliding_attention" else None for t, k in zip(types, kwargs, strict=True)]


def refuse_inconsistent_latent_attention(config) -> None:
    """Multi-head latent attention (DeepSeek-V2/V3: a `kv_lora_rank`) is verified exactly through transformers'
    forward, its per-head keys and values cached per position like any others (tests/test_architectures.py). But its
    keys come one per attention head: a config declaring fewer key/value heads (DeepSeek's own set both equal) makes
    transformers repeat them into more heads than the queries have, and every pass of two tokens or more fails inside
    torch. Refused at load, with that reason, instead of a tensor size mismatch at the first draft or prompt."""
    heads, kv_heads = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    if getattr(config, "kv_lora_rank", None) and kv_heads is not None and kv_heads != heads:
        raise BlockdraftError(
            f"'{config.model_type}' uses multi-head latent attention, whose keys and values come one per attention "
            f"head ({heads}), but its config declares num_key_value_heads={kv_heads}: transformers' forward then "
            "repeats them by the wrong factor and cannot run a pass of several tokens, so blockdraft cannot verify "
            "drafts with it (DeepSeek's own configs set num_key_value_heads = num_attention_heads)")


class HFForward:
    """The same protocol as `StaticEngine` (reset / forward / commit), through `model(...)`.

    The cache keeps every position on every layer, sliding-window layers included (transformers' own
    DynamicCache for a config keeps only a window there, which the tree passes' extra nodes and the
    commits' slicing cannot be reconciled with). The window is then applied by the mask instead: each pass
    builds one boolean mask per kind of layer (full; each window size) from the tree's ancestors and the
    nodes' positions, and hands transformers a dict by layer type when the model mixes both kinds (how
    transformers 5's models take precomputed masks, `masking_utils`). A commit keeps the accepted path's
    entries (moved next to the prefix when the path is not the first nodes) and slices the rest off.
    """

    def __init__(self, model):
        self.model = model
        self.cache: DynamicCache | None = None
        self.length = 0
        # transformers renamed `past_key_values` to `cache` in 5.x; pass whichever this version takes.
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.windows = layer_windows(model.config)
        if "position_ids" not in params:  # a tree node's position is not its index: it must be passed
            raise BlockdraftError(f"'{model.config.model_type}' takes no position ids: blockdraft cannot verify "
                                  "draft trees with it exactly")
        self.windowed = any(w is not None for w in self.windows)
        self.mixed = len(set(self.windows)) > 1
        if self.mixed and len({w for w in self.windows if w is not None}) > 1:
            raise BlockdraftError(f"'{model.config.model_type}' mixes several sliding-window sizes: not supported")
        if self.mixed and not _takes_mask_per_layer_type(model):
            raise BlockdraftError(f"'{model.config.model_type}' mixes full and sliding-window layers but its forward "
                                  "takes no mask per layer type: blockdraft cannot verify it exactly")

    def reset(self) -> None:
        self.cache = DynamicCache()  # no config: full-length layers everywhere (see the class docstring)
        self.length = 0

    def _masks(self, n: int, positions: torch.Tensor, allowed: torch.Tensor | None, device):
        """The attention_mask argument: None (plain causal: transformers builds it), or an additive 4D mask,
        or a dict of them by layer type."""
        start = self.length
        if allowed is None and not self.windowed:
            return None
        if allowed is None:
            allowed = torch.ones(n, n, dtype=torch.bool, device=device).tril_()
        full = torch.ones(n, start + n, dtype=torch.bool, device=device)
        full[:, start:] = allowed
        masks = {}
        for window in set(self.windows):
            keep = full
            if window is not None:  # a key is seen while its position is within the window of the query's
                key_pos = torch.cat([torch.arange(start, device=device), positions])
                keep = full & (key_pos[None, :] > positions[:, None] - window)
            masks[window] = self._additive(keep)
        if not self.mixed:
            return masks[self.windows[0]]
        return {"full_attention": masks[None],
                "sliding_attention": masks[next(w for w in self.windows if w is not None)]}

    def _additive(self, keep: torch.Tensor) -> torch.Tensor:
        dtype = self.model.dtype
        mask = torch.zeros(1, 1, *keep.shape, dtype=dtype, device=keep.device)
        return mask.masked_fill_(~keep, torch.finfo(dtype).min)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor | None = None,
                hidden_layers: tuple[int, ...] = (), last_logits_only: bool = False):
        n, start = tokens.shape[0], self.length
        out = self.model(
            input_ids=tokens.unsqueeze(0),
            position_ids=positions.unsqueeze(0),
            attention_mask=self._masks(n, positions, allowed, tokens.device),
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


def _takes_mask_per_layer_type(model) -> bool:
    """Whether the decoder's forward accepts a dict of masks by layer type (transformers 5's hybrid models do)."""
    inner = model.get_decoder() if hasattr(model, "get_decoder") else model
    try:
        source = inspect.getsource(type(inner).forward)
    except (OSError, TypeError):
        return False
    return "attention_mask, dict)" in source
