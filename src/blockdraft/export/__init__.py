"""`blockdraft export`: drafters written in other engines' checkpoint formats."""

from .vllm import FORMATS, dflash_mismatches, export_vllm, medusa_mismatches

__all__ = ["FORMATS", "dflash_mismatches", "export_vllm", "medusa_mismatches"]
