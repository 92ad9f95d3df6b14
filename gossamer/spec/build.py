"""From a `SpecConfig` to a ready `Speculator` (draft and EAGLE weights load here)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gossamer.spec.config import SpecConfig, SpecConfigError
from gossamer.spec.ngram import NgramProposer
from gossamer.spec.proposer import Proposer
from gossamer.spec.speculator import Speculator
from gossamer.spec.suffix import SuffixProposer

if TYPE_CHECKING:
    from gossamer.engine.core import EngineConfig
    from gossamer.model.gpt_oss import GptOssForCausalLM


def build_speculator(
    config: SpecConfig,
    target: GptOssForCausalLM,
    engine_config: EngineConfig,
    num_blocks: int,
) -> Speculator:
    """`num_blocks`: the target's KV block count (the default size of a draft model's pool)."""
    _check_tree_fits(config, engine_config)
    proposers: dict[str, Proposer] = {}
    runner_class = None
    for method in config.proposer_methods:
        if method == "ngram":
            proposers[method] = NgramProposer(
                config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max
            )
        elif method == "suffix":
            proposers[method] = SuffixProposer(
                config.num_speculative_tokens,
                max_depth=config.suffix_decoding_max_tree_depth,
                max_cached_requests=config.suffix_decoding_max_cached_requests,
                max_spec_factor=config.suffix_decoding_max_spec_factor,
                min_token_prob=config.suffix_decoding_min_token_prob,
            )
        elif method == "draft":
            from gossamer.spec.draft_model import DraftModelProposer

            proposers[method] = DraftModelProposer.load(config, target, engine_config, num_blocks)
        elif method == "eagle3":
            from gossamer.spec.eagle3 import Eagle3Proposer

            proposer = Eagle3Proposer.load(config, target, engine_config, num_blocks)
            proposers[method] = proposer
            runner_class = proposer.target_runner_class()
    speculator = Speculator(config, proposers)
    speculator.target_runner_class = runner_class
    return speculator


def _check_tree_fits(config: SpecConfig, engine_config: EngineConfig) -> None:
    """A tree's nodes are tokens of the step that verifies them, next to the pending token."""
    tree = config.tree
    if tree is not None and 1 + tree.num_nodes > engine_config.max_num_batched_tokens:
        raise SpecConfigError(
            f"speculative config: the tree's {tree.num_nodes} nodes and the pending token do not "
            f"fit max_num_batched_tokens={engine_config.max_num_batched_tokens}; use a smaller "
            "tree or a larger token budget"
        )
