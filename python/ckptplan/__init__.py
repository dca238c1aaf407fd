"""Activation checkpointing plans for transformer training, from the ckptplan planner."""

__version__ = "0.1.0"
