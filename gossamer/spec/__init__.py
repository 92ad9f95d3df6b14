"""Speculative decoding: proposers behind one `Proposer` protocol (ngram, suffix, draft model,
EAGLE-3), exact verification (greedy and rejection sampling), and the `Speculator` hook that
EngineCore calls. See docs/speculative.md.

Only the light modules are imported here, so that the engine config can name a `SpecConfig`
without loading any proposer.
"""

from gossamer.spec.config import (
    SpecConfig,
    SpecConfigError,
    add_spec_arguments,
    parse_spec_config,
    spec_config_from_args,
)
from gossamer.spec.proposer import Draft, Proposer, SpecRequest

__all__ = [
    "Draft",
    "Proposer",
    "SpecConfig",
    "SpecConfigError",
    "SpecRequest",
    "add_spec_arguments",
    "parse_spec_config",
    "spec_config_from_args",
]
