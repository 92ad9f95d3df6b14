"""Draft-model proposer: a smaller GPT-OSS checkpoint guesses the next k tokens, one forward pass
per token (chain drafts).

Design: the draft model has its own `ModelRunner` (persistent buffers, CUDA graphs for its 1-token
steps, and with a tree shape tree graphs for its tree and catch-up steps) and its own `KVCacheManager` over a separate, smaller block pool (default: the target's block
count, which holds as many tokens as the target's pool at the draft's smaller per-token cost). It is
not scheduled by the engine's scheduler: it lives one step behind the target, in `propose()`:

1. catch up: roll its cache back to the longest prefix it computed that is still true (after a
   verification: the known tokens plus the accepted drafts), then feed the true tokens it has not
   seen, the target's pending last token included (chunked to the runner's token budget);
2. chain: draw draft 0 from the last logits, feed it, draw draft 1, ... k - 1 feeds in all.
   Or, with a tree shape, grow the tree one depth at a time (drafting.grow_trees): the nodes of
   depth d are the top-ranked tokens after their parents, whose logits come from one feed of all
   nodes so far under a tree mask (earlier depths are fed again: their KV in the draft's cache
   would be seen by every node, ancestor or not). The nodes never count as fed: the next
   proposal overwrites their slots, and the true tokens the target accepted are fed in its
   catch-up.

Prefix caching is off in the draft pool: its tables hold speculative tokens that get rolled back.
When the pool runs dry, the states of requests outside the current batch are dropped first, then
the request itself goes without a draft; a dropped request recomputes from its first token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch

from gossamer.cache.layout import KVCacheLayout
from gossamer.cache.manager import KVCacheManager
from gossamer.model.gpt_oss import GptOssForCausalLM
from gossamer.runner.model_runner import ModelRunner, SeqInput
from gossamer.spec.drafting import draw_drafts, grow_trees, stack_probs
from gossamer.spec.proposer import BaseProposer, Draft, SpecRequest
from gossamer.spec.tree import TreeShape, ancestor_masks

if TYPE_CHECKING:
    from gossamer.engine.core import EngineConfig
    from gossamer.spec.config import SpecConfig


class DraftModelError(ValueError):
    """A draft model that cannot serve this target (different vocabulary, ...)."""


@dataclass(eq=False)
class _DraftSequence:
    """A request in the draft's cache (the `CacheRequest` the manager reads)."""

    request_id: str
    all_token_ids: list[int] = field(default_factory=list)  # fed tokens, drafts included
    num_computed_tokens: int = 0
    num_true_tokens: int = 0  # leading fed tokens known to be the request's own
    cache_salt: str | None = None
    block_hashes: list[int] = field(default_factory=list)


class DraftModelProposer(BaseProposer):
    name = "draft"

    def __init__(
        self,
        model: GptOssForCausalLM,
        *,
        num_speculative_tokens: int,
        num_blocks: int,
        block_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        cuda_graphs: bool = True,
        seed: int = 0,
        tree: TreeShape | None = None,
    ) -> None:
        self.model = model
        self.num_speculative_tokens = num_speculative_tokens
        self.tree = tree
        self.manager = KVCacheManager.from_layout(
            KVCacheLayout.from_model_config(model.config),
            num_blocks,
            block_size=block_size,
            enable_prefix_caching=False,
        )
        self.runner = ModelRunner(
            model,
            num_blocks=num_blocks,
            block_size=block_size,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            cuda_graphs=cuda_graphs,
            # tree growth (at most every node) and catch-up steps (accepted tokens + 1) replay
            # tree graphs of this many tokens per sequence
            tree_query_len=None if tree is None else 1 + tree.num_nodes,
        )
        self.shared_generator = torch.Generator().manual_seed(seed)
        self._sequences: dict[str, _DraftSequence] = {}

    @classmethod
    def load(
        cls,
        config: SpecConfig,
        target: GptOssForCausalLM,
        engine_config: EngineConfig,
        num_blocks: int,
    ) -> DraftModelProposer:
        from gossamer.model.loader import load_model

        draft = load_model(
            config.model,
            load_format=config.draft_load_format,
            dtype=target.dtype,
            device=str(target.device),
            ops=target.ops.name,
            max_model_len=target.max_model_len,
            seed=engine_config.seed + 1,
        ).model
        if draft.config.vocab_size != target.config.vocab_size:
            raise DraftModelError(
                f"the draft model's vocabulary has {draft.config.vocab_size} tokens and the "
                f"target's {target.config.vocab_size}; a draft model must share the tokenizer"
            )
        return cls(
            draft,
            num_speculative_tokens=config.num_speculative_tokens,
            num_blocks=config.draft_num_blocks or num_blocks,
            block_size=engine_config.block_size,
            max_num_seqs=engine_config.max_num_seqs,
            max_num_batched_tokens=engine_config.max_num_batched_tokens,
            cuda_graphs=engine_config.cuda_graphs,
            seed=engine_config.seed + 1,
            tree=config.tree,
        )

    # ---- proposing -----------------------------------------------------------------------------

    def propose(self, requests: Sequence[SpecRequest]) -> list[Draft | None]:
        batch_ids = {request.request_id for request in requests}
        ready: list[tuple[int, SpecRequest, _DraftSequence, int]] = []
        for index, request in enumerate(requests):
            count = min(self.num_speculative_tokens, request.max_draft_tokens)
            if self.tree is not None:  # the nodes within that depth
                count = self.tree.num_nodes_within(count)
            sequence = self._prepare(request, count, batch_ids)
            if sequence is not None:
                ready.append((index, request, sequence, count))
        drafts: list[Draft | None] = [None] * len(requests)
        if not ready:
            return drafts
        first_logits = self._catch_up([(request, sequence) for _, request, sequence, _ in ready])
        if self.tree is not None:
            return self._trees(ready, first_logits, drafts)
        chains = self._chain(ready, first_logits)
        for (index, *_), (tokens, probs) in zip(ready, chains, strict=True):
            drafts[index] = Draft(tokens, stack_probs(probs))
        return drafts

    def _prepare(
        self, request: SpecRequest, count: int, batch_ids: set[str]
    ) -> _DraftSequence | None:
        """Roll the request's draft cache back to what is still true and make room for the
        catch-up tokens and count drafts (a chain feeds count - 1 of them, a tree at most all).
        None when the pool cannot hold it."""
        truth = request.token_ids
        sequence = self._sequences.get(request.request_id)
        if sequence is None or not self.manager.has_request(request.request_id):
            sequence = self._sequences[request.request_id] = _DraftSequence(request.request_id)
        valid = _common_prefix(sequence, truth)
        valid = min(valid, len(truth) - 1)  # the last true token is always fed: its logits
        if valid < sequence.num_computed_tokens:
            self.manager.truncate(request.request_id, valid)
        del sequence.all_token_ids[valid:]
        sequence.num_computed_tokens = sequence.num_true_tokens = valid
        num_new = len(truth) - valid + count - (self.tree is None)
        if self._allocate(sequence, num_new, batch_ids):
            return sequence
        self._drop(request.request_id)
        return None

    def _allocate(self, sequence: _DraftSequence, num_new: int, batch_ids: set[str]) -> bool:
        if self.manager.allocate_slots(sequence, num_new):
            return True
        for request_id in [r for r in self._sequences if r not in batch_ids]:
            self._drop(request_id)
        return self.manager.allocate_slots(sequence, num_new)

    def _catch_up(self, batch: list[tuple[SpecRequest, _DraftSequence]]) -> list[torch.Tensor]:
        """Feed each request's unseen true tokens; returns each one's last logits [vocab]."""
        budget = self.runner.max_tokens
        last: list[torch.Tensor | None] = [None] * len(batch)
        while any(last_logits is None for last_logits in last):
            seqs, owners, used = [], [], 0
            for i, (request, sequence) in enumerate(batch):
                if last[i] is not None or used == budget:
                    continue
                pending = request.token_ids[sequence.num_computed_tokens :]
                take = min(len(pending), budget - used)
                finishing = take == len(pending)
                seqs.append(self._seq_input(sequence, pending[:take], 1 if finishing else 0))
                owners.append((i, finishing))
                used += take
            logits = self.runner.run(seqs)
            row = 0
            for i, finishing in owners:
                if finishing:
                    last[i] = logits[row].clone()  # a graph replay reuses its output buffer
                    row += 1
            for seq, (i, _) in zip(seqs, owners, strict=True):
                self._advance(batch[i][1], seq.token_ids, true_tokens=True)
        return [logits for logits in last if logits is not None]

    def _chain(
        self,
        ready: list[tuple[int, SpecRequest, _DraftSequence, int]],
        first_logits: list[torch.Tensor],
    ) -> list[tuple[list[int], list[torch.Tensor | None]]]:
        chains: list[tuple[list[int], list[torch.Tensor | None]]] = [([], []) for _ in ready]
        logits = torch.stack(first_logits)
        active = list(range(len(ready)))
        while True:
            rows = [ready[i][1].row for i in active]
            tokens, probs = draw_drafts(logits, rows, self.shared_generator)
            for i, token, q in zip(active, tokens, probs, strict=True):
                chains[i][0].append(token)
                chains[i][1].append(q)
            active = [i for i in active if len(chains[i][0]) < ready[i][3]]
            if not active:
                return chains
            seqs = [self._seq_input(ready[i][2], [chains[i][0][-1]], 1) for i in active]
            logits = self.runner.run(seqs)
            for i, seq in zip(active, seqs, strict=True):
                self._advance(ready[i][2], seq.token_ids, true_tokens=False)

    def _trees(
        self,
        ready: list[tuple[int, SpecRequest, _DraftSequence, int]],
        first_logits: list[torch.Tensor],
        drafts: list[Draft | None],
    ) -> list[Draft | None]:
        """Top-k tree drafts (see the module doc); `ready`'s counts are node counts here."""
        tree = self.tree
        sizes = [count for *_, count in ready]

        def score(deeper: list[int], tokens: list[list[int]]) -> torch.Tensor:
            seqs = []
            for r in deeper:
                nodes = tokens[r]
                depth = tree.depths[len(nodes) - 1]
                masks = ancestor_masks(tree.parents[: len(nodes)], with_root=False)
                seq = self._seq_input(ready[r][2], nodes, len(tree.level(depth, len(nodes))))
                seqs.append(replace(seq, tree_mask=masks))
            return self._run_within_budget(seqs)

        grown = grow_trees(tree, sizes, torch.stack(first_logits), score)
        for (index, *_), tokens in zip(ready, grown, strict=True):
            drafts[index] = Draft(tokens, None, list(tree.parents[: len(tokens)]))
        return drafts

    def _run_within_budget(self, seqs: list[SeqInput]) -> torch.Tensor:
        """The logits of `seqs`, run in as many steps as the runner's token budget needs."""
        runner, parts, batch, used = self.runner, [], [], 0
        for seq in seqs:
            if batch and used + len(seq.token_ids) > runner.max_tokens:
                parts.append(runner.run(batch))
                batch, used = [], 0
            batch.append(seq)
            used += len(seq.token_ids)
        parts.append(runner.run(batch))
        return torch.cat(parts)

    def _seq_input(self, sequence: _DraftSequence, tokens: list[int], num_logits: int) -> SeqInput:
        tables = self.manager.block_tables(sequence.request_id)
        return SeqInput(list(tokens), sequence.num_computed_tokens, tables, num_logits)

    @staticmethod
    def _advance(sequence: _DraftSequence, tokens: list[int], true_tokens: bool) -> None:
        sequence.all_token_ids.extend(tokens)
        sequence.num_computed_tokens += len(tokens)
        if true_tokens:
            sequence.num_true_tokens = sequence.num_computed_tokens

    # ---- bookkeeping ---------------------------------------------------------------------------

    def _drop(self, request_id: str) -> None:
        self.manager.free(request_id)
        self._sequences.pop(request_id, None)

    def release(self, request_id: str, token_ids: Sequence[int], num_prompt_tokens: int) -> None:
        self._drop(request_id)


def _common_prefix(sequence: _DraftSequence, truth: Sequence[int]) -> int:
    """How many leading computed tokens of the draft cache match the request's tokens. Tokens
    before num_true_tokens were true when fed and the truth only grows, so only the drafts fed
    after them are compared."""
    fed = sequence.all_token_ids
    position = sequence.num_true_tokens
    end = min(sequence.num_computed_tokens, len(truth))
    while position < end and fed[position] == truth[position]:
        position += 1
    return position
