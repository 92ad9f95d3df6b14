"""Counters of speculative decoding, flattened into `EngineStats.spec_stats`.

Keys (cumulative since start):
- num_drafts: verified proposals; num_draft_tokens: verified draft tokens;
  num_accepted_tokens: accepted draft tokens;
- acceptance_rate: accepted / drafted tokens;
- mean_accepted_length: tokens emitted per verified proposal, the extra token included
  (1 + accepted / drafts), the number a speedup estimate needs;
- acceptance_rate_pos_{i}: of the proposals that had a draft at position i, the share whose
  draft i was accepted (so pos_0 >= pos_1 >= ...);
- tree drafts: num_draft_tokens counts every node (what verification computed), so acceptance_rate
  is accepted tokens per verified node and falls as trees widen; positions are depths (pos_i: of
  the trees with a node at depth i + 1, the share that accepted a path that deep);
  mean_accepted_length keeps its meaning (tokens per step and request). num_draft_positions adds
  up the longest acceptable length of each proposal (a chain's length, a tree's depth: equal to
  num_draft_tokens without trees), num_tree_drafts counts the tree proposals and
  num_tree_verify_steps the steps that verified trees (eager: no graph holds a tree mask);
- {method}_num_drafts, {method}_num_accepted_tokens, {method}_num_draft_tokens: per proposer;
- num_disabled_requests: times a request's speculation switched off for low acceptance;
  num_disabled_steps: steps without proposals because the batch was too large;
- num_uniform_verify_steps: verification steps of one shape (every sequence feeds 1 + k tokens),
  which a CUDA graph replays; num_ragged_verify_steps: decode-only ones whose draft lengths
  differ (eager); num_prefill_verify_steps: ones that also carry a prompt chunk (eager);
- num_padding_tokens: filler tokens fed to make steps uniform (computed, never accepted);
- num_cost_off_steps: steps the cost-aware choice of k decided not to speculate at all;
- num_guard_off_steps: steps the measured guard kept plain (gossamer/spec/guard.py; its state
  per batch bucket is in the speculator's stats as guard_b{bucket}_*);
- num_idle_overlapped_steps: steps that ran overlapped (launched before the previous step's tokens
  reached the host, EngineConfig.async_scheduling) because speculation was idle at their batch
  (Speculator.idle_for); each is also counted under its reason above (disabled, guard or cost off).
"""

from __future__ import annotations

from collections import defaultdict


class SpecMetrics:
    def __init__(self, max_positions: int) -> None:
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.drafted_at = [0] * max_positions
        self.accepted_at = [0] * max_positions
        self.by_method: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
        self.num_disabled_requests = 0
        self.num_disabled_steps = 0
        self.num_uniform_verify_steps = 0
        self.num_ragged_verify_steps = 0
        self.num_prefill_verify_steps = 0
        self.num_padding_tokens = 0
        self.num_cost_off_steps = 0
        self.num_guard_off_steps = 0
        self.num_idle_overlapped_steps = 0
        self.num_draft_positions = 0
        self.num_tree_drafts = 0
        self.num_tree_verify_steps = 0

    def record(
        self, method: str, num_drafted: int, num_accepted: int, depth: int | None = None
    ) -> None:
        """One verified proposal of `num_drafted` tokens; `depth` for a tree (None: a chain)."""
        positions = num_drafted if depth is None else depth
        self.num_drafts += 1
        self.num_draft_tokens += num_drafted
        self.num_accepted_tokens += num_accepted
        self.num_draft_positions += positions
        self.num_tree_drafts += depth is not None
        for position in range(min(positions, len(self.drafted_at))):
            self.drafted_at[position] += 1
            self.accepted_at[position] += position < num_accepted
        counts = self.by_method[method]
        counts[0] += 1
        counts[1] += num_drafted
        counts[2] += num_accepted

    def as_dict(self) -> dict[str, float]:
        stats: dict[str, float] = {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "acceptance_rate": _ratio(self.num_accepted_tokens, self.num_draft_tokens),
            "mean_accepted_length": 1 + _ratio(self.num_accepted_tokens, self.num_drafts),
            "num_disabled_requests": self.num_disabled_requests,
            "num_disabled_steps": self.num_disabled_steps,
            "num_uniform_verify_steps": self.num_uniform_verify_steps,
            "num_ragged_verify_steps": self.num_ragged_verify_steps,
            "num_prefill_verify_steps": self.num_prefill_verify_steps,
            "num_padding_tokens": self.num_padding_tokens,
            "num_cost_off_steps": self.num_cost_off_steps,
            "num_guard_off_steps": self.num_guard_off_steps,
            "num_idle_overlapped_steps": self.num_idle_overlapped_steps,
            "num_draft_positions": self.num_draft_positions,
            "num_tree_drafts": self.num_tree_drafts,
            "num_tree_verify_steps": self.num_tree_verify_steps,
        }
        for position, drafted in enumerate(self.drafted_at):
            stats[f"acceptance_rate_pos_{position}"] = _ratio(self.accepted_at[position], drafted)
        for method, (drafts, drafted, accepted) in sorted(self.by_method.items()):
            stats[f"{method}_num_drafts"] = drafts
            stats[f"{method}_num_draft_tokens"] = drafted
            stats[f"{method}_num_accepted_tokens"] = accepted
        return stats


def _ratio(numerator: int, denominator: int) -> float:
    return numerator / denominator if denominator else 0.0
