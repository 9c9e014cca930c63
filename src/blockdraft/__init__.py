"""blockdraft: block drafting and lossless tree verification for faster language model decoding."""

from .api import generate, load_target
from .decoding import BatchDecoder, GenerationResult, GenerationStats, SpeculativeDecoder
from .drafters import DraftContext, Drafter, NoDrafter, PromptLookupDrafter
from .errors import BlockdraftError
from .methods import METHODS, make_drafter
from .model import Target
from .trees import DraftTree
from .verify import SamplingParams, make_acceptor

__version__ = "0.1.0"

__all__ = [
    "METHODS",
    "BatchDecoder",
    "BlockdraftError",
    "DraftContext",
    "DraftTree",
    "Drafter",
    "GenerationResult",
    "GenerationStats",
    "NoDrafter",
    "PromptLookupDrafter",
    "SamplingParams",
    "SpeculativeDecoder",
    "Target",
    "generate",
    "load_target",
    "make_acceptor",
    "make_drafter",
]
