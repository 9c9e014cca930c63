"""`blockdraft export`: drafters written in other engines' checkpoint formats."""

from .vllm import EXPORTERS, dflash_mismatches, export_vllm, medusa_mismatches

__all__ = ["EXPORTERS", "dflash_mismatches", "export_vllm", "medusa_mismatches"]
