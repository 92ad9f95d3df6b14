"""Errors a user of `gossamer bench` can cause (bad arguments, unreadable files)."""

from __future__ import annotations


class BenchConfigError(ValueError):
    """A benchmark option or input file is invalid; the message says what to change."""
