"""Gossamer: a lean, fast inference engine and server for GPT-OSS models."""

__version__ = "0.1.0"
