"""Drafter training: target feature store, losses, training loops."""
