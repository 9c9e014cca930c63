"""Target: one causal LM, its KV cache, and the three calls speculative decoding needs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import BlockdraftError
from ..trees import DraftTree
from . import engine as static_engine
from .hf_forward import HFForward
from .loading import DEFAULT_TARGET, load_target, resolve_target
from .precision import check_weights, resolve_precision, resolve_weights


@dataclass
class TargetOutput:
    """What one verification pass returns for the nodes of a draft tree."""

    logits: torch.Tensor  # [n, V] in the target's dtype, on the CPU: the next-token logits at every node
    features: torch.Tensor | None  # [n, F]: hidden states of the feature layers, concatenated


def make_forwarder(model, engine: str = "auto", compile: bool = False, weights: str = "full",
                   planes: dict | None = None):
    """'static': the fast static-cache engine (Llama-family models); 'hf': transformers' forward;
    'auto': static where it supports the model, else hf. `compile` runs the static engine's steps through
    torch.compile (model/engine.py); transformers' forward stays eager. `weights` int8 / int4 (with a GGUF
    file's own `planes`, see model/gguf_weights.py) need the static engine."""
    if engine not in ("auto", "static", "hf"):
        raise BlockdraftError(f"unknown engine '{engine}': choose auto, static or hf")
    supported = engine != "hf" and static_engine.supports(model)
    if engine == "static" and not supported:
        raise BlockdraftError(f"the static engine does not support model type '{model.config.model_type}'")
    if weights != "full":
        if not supported:
            raise BlockdraftError(
                f"--weights {weights} runs in the static engine, and this target ('{model.config.model_type}') runs "
                f"on transformers' forward{' (--engine hf)' if engine == 'hf' else ''}: use --weights full")
        if _device_of(model).type != "cpu":
            raise BlockdraftError(f"--weights {weights} runs on torch's CPU int4 kernel: use --device cpu")
        try:
            return static_engine.StaticEngine(model, compile=compile, weights=weights, planes=planes)
        except ValueError as e:
            raise BlockdraftError(f"--weights {weights}: {e}") from None
    return static_engine.StaticEngine(model, compile=compile) if supported else HFForward(model)


def _device_of(model) -> torch.device:
    """Where a model computes (a GGUF target's quantized tensors stay on the meta device, model/gguf_model.py: its
    other parameters tell)."""
    return next((p.device for p in model.parameters() if not p.is_meta), torch.device("cpu"))


class Target:
    """Wraps a Hugging Face causal LM for speculative decoding at batch size 1.

    The protocol, per decoding step:
      prefill(prompt[:-1])   once: fills the KV cache, leaves the last prompt token as the root
      verify(tree)           one forward over all tree nodes (ancestor-only mask, position = start + depth)
      commit(path)           keep the KV entries of the accepted path only

    The KV cache therefore always holds every committed token except the newest one (the
    root of the next tree), exactly like plain autoregressive decoding.

    `dtype` and `device` are the model's own: the one source of truth that drafters, rescorers
    and runners read to place their tensors (choose them with `Target.load(dtype=, device=)`).
    `compile=True` compiles the engine's decoding steps (~1.5 min once per process on 2 cores, then
    ~20% faster steps; see model/engine.py); `compiled` and `compile_seconds` report it. `weights`
    ("full", "int8", "int4"; model/linear.py) is what the target's projections hold: with int8 or int4 the target
    *is* the quantized model, and every method is lossless against it. `planes` (from a GGUF file's own blocks,
    model/gguf_weights.py) gives their exact values; without it they are quantized from the model's weights.
    """

    def __init__(self, model, tokenizer=None, name: str | None = None, feature_layers: tuple[int, ...] = (),
                 engine: str = "auto", compile: bool = False, weights: str = "full", planes: dict | None = None):
        self.model = model.eval()
        self._device = _device_of(model)
        self.tokenizer = tokenizer
        self.name = name or getattr(model.config, "name_or_path", None) or model.config.model_type
        self.config = model.config
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.hidden_size = model.config.hidden_size
        self.num_layers = model.config.num_hidden_layers
        self.max_length = getattr(model.config, "max_position_embeddings", None) or 2**31
        self.feature_layers = tuple(feature_layers)
        self.forwarder = make_forwarder(model, engine, compile, weights, planes)
        self.weights = getattr(getattr(self.forwarder, "decoder", None), "weights", "full")
        self.length = 0  # tokens in the KV cache

    @classmethod
    def load(cls, name_or_path: str | None = None, dtype: str | torch.dtype = "auto",
             device: str | torch.device = "auto", weights: str = "auto", **kw) -> "Target":
        """Load a target by name (default: smollm2-135m), model folder or GGUF file, in `dtype` on `device`
        ('auto': see model/precision.py; float32 is the bitwise-exact reference), with `weights` full, int8 or
        int4 (from a GGUF file: its own quantized blocks where they have an exact form, model/gguf_weights.py)."""
        dtype, device = resolve_precision(dtype, device)  # bad names fail before the slow load
        check_weights(weights)
        source = resolve_target(name_or_path or DEFAULT_TARGET)
        weights = resolve_weights(weights, device, source)
        model, tokenizer, planes = load_target(source, dtype, weights)
        if not any(p.is_meta for p in model.parameters()):  # (a GGUF target's quantized tensors: CPU only)
            model = model.to(device)
        return cls(model, tokenizer, name=source.name, weights=weights, planes=planes, **kw)

    @property
    def compiled(self) -> bool:
        return getattr(self.forwarder, "compiled", None) is not None

    @property
    def compile_seconds(self) -> float:
        """Time the compiled engine's first calls took (0 when not compiled, or not yet called)."""
        return getattr(self.forwarder, "compile_seconds", 0.0)

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @property
    def device(self) -> torch.device:
        return self._device

    # --- text ---------------------------------------------------------------------
    @property
    def eos_token_ids(self) -> set[int]:
        ids = set()
        for src in (self.model.generation_config, self.config):
            eos = getattr(src, "eos_token_id", None)
            ids.update(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """Strings that end a reply whatever the request says: a base model's end of turn (model/loading.py)."""
        stops = getattr(self.model.generation_config, "stop_strings", None) or ()
        return (stops,) if isinstance(stops, str) else tuple(stops)

    def encode(self, prompt: str, chat_template: bool = True) -> list[int]:
        """Prompt text -> token ids, through the chat template when the model has one."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise BlockdraftError("the prompt is empty")
        if self.tokenizer is None:
            raise BlockdraftError("this target has no tokenizer: pass token ids instead of text")
        if chat_template and getattr(self.tokenizer, "chat_template", None):
            messages = [{"role": "user", "content": prompt}]
            out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            ids = out["input_ids"] if hasattr(out, "keys") else out
        else:
            ids = self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
        return list(ids)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(out["input_ids"] if hasattr(out, "keys") else out)

    def decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    # --- the speculative decoding protocol ----------------------------------------
    def check_prompt(self, ids: list[int]) -> None:
        if len(ids) == 0:
            raise BlockdraftError("the prompt is empty")
        if len(ids) >= self.max_length:
            raise BlockdraftError(
                f"the prompt has {len(ids)} tokens but the target's context holds {self.max_length}"
            )
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise BlockdraftError(f"token id {bad[0]} is outside the target's vocabulary of {self.vocab_size}")

    @torch.inference_mode()
    def prefill(self, ids: list[int]) -> torch.Tensor | None:
        """Start a new sequence: run `ids` into a fresh KV cache. Returns their features."""
        self.forwarder.reset()
        self.length = 0
        if not ids:
            return None
        device = self.device
        x = torch.tensor(ids, device=device)
        _, hidden = self.forwarder.forward(x, torch.arange(len(ids), device=device), None, self.feature_layers,
                                           last_logits_only=True)
        self.length = len(ids)
        return self._features(hidden)

    @torch.inference_mode()
    def verify(self, tree: DraftTree) -> TargetOutput:
        """One forward pass over every tree node; each node attends to the cache and its ancestors."""
        device = self.device
        positions = (self.length + tree.depth).to(device)
        allowed = None if tree.is_chain() else tree.ancestor_mask().to(device)  # a chain is plain causal
        logits, hidden = self.forwarder.forward(tree.tokens.to(device), positions, allowed, self.feature_layers)
        # Acceptors run on the CPU (tiny trees, Python control flow); features stay on the device. The logits stay
        # in the target's dtype: converting every row of a large tree is wasted work, as the greedy acceptor reads
        # only the accepted path's rows (samplers convert what they read; BENCHMARKS.md, "Decisions": acceptance
        # costs).
        return TargetOutput(logits.cpu(), self._features(hidden))

    @torch.inference_mode()
    def commit(self, path: list[int]) -> None:
        """Keep the KV entries of the accepted nodes `path` (root first), drop the rest of the tree."""
        self.forwarder.commit(self.length, path)
        self.length += len(path)

    def _features(self, hidden: list[torch.Tensor]) -> torch.Tensor | None:
        return torch.cat(hidden, dim=-1) if hidden else None
