"""The target model: loading, tree verification and KV-cache bookkeeping."""

from .loading import DEFAULT_TARGET, load_model_and_tokenizer, resolve_target
from .precision import resolve_device, resolve_dtype, resolve_precision
from .target import Target, TargetOutput

__all__ = ["DEFAULT_TARGET", "Target", "TargetOutput", "load_model_and_tokenizer", "resolve_device",
           "resolve_dtype", "resolve_precision", "resolve_target"]
