"""`blockdraft serve`: an OpenAI-compatible HTTP server over speculative decoding, with a playground page."""

from .app import create_app
from .scheduler import Scheduler

__all__ = ["Scheduler", "create_app"]
