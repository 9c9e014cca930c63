"""User-facing errors: one clear sentence naming the problem, no torch stack trace."""


class BlockdraftError(ValueError):
    """Bad input or configuration. The CLI prints the message and exits with code 2."""


class TargetNotInstalled(BlockdraftError):
    """The default target's weights package is missing."""
