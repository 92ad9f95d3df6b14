"""A fake model runner that really goes through the paged KV cache.

It keeps its own copy of every block table, built only from the deltas in `SchedulerOutput`
(as the real runner must), writes each fed token into its slot of each group, and computes the
next token from the tokens it reads back through the tables: the whole prefix through the full
group, the last `window` tokens through the sliding group. Any wrong table, slot, shared block,
released-too-early block or rollback changes the generated tokens, which the tests compare with
`reference_generate` (the same function on plain lists).
"""

from __future__ import annotations

from dataclasses import dataclass

from gossamer.cache import NULL_BLOCK_ID, KVCacheManager
from gossamer.scheduler import SchedulerOutput

VOCAB = 37


def next_token(prefix_sum: int, window_tokens: list[int], length: int) -> int:
    return (prefix_sum * 31 + sum(window_tokens) * 17 + length * 7) % VOCAB


@dataclass
class Params:
    """A stand-in for the lead's SamplingParams (the scheduler only reads these fields)."""

    max_tokens: int | None = 8
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0


def reference_generate(
    prompt: list[int], params: Params, window: int, eos: frozenset[int], max_model_len: int | None
) -> list[int]:
    tokens = list(prompt)
    output: list[int] = []
    while True:
        token = next_token(sum(tokens), tokens[-window:], len(tokens))
        tokens.append(token)
        output.append(token)
        stops = set(params.stop_token_ids) | (set() if params.ignore_eos else eos)
        if len(output) >= params.min_tokens and token in stops:
            return output
        if params.max_tokens is not None and len(output) >= params.max_tokens:
            return output
        if max_model_len is not None and len(tokens) >= max_model_len:
            return output


class FakeRunner:
    def __init__(self, manager: KVCacheManager, window: int) -> None:
        self.manager = manager
        self.window = window
        self.block_size = manager.block_size
        size = manager.pool.num_blocks * self.block_size
        # Per group, per slot: (position, token) written there, like a KV tensor.
        self.kv: list[list[tuple[int, int] | None]] = [[None] * size for _ in manager.groups]
        self.tables: dict[str, list[list[int]]] = {}
        self.sliding = [g.sliding_window is not None for g in manager.groups]
        assert False in self.sliding, "the fake model reads the prefix through a full group"

    def execute(self, output: SchedulerOutput) -> dict[str, list[int]]:
        for request_id in (
            *output.finished_request_ids,
            *output.aborted_request_ids,
            *output.preempted_request_ids,
        ):
            self.tables.pop(request_id, None)
        sampled = {}
        for scheduled in output.scheduled_requests:
            tables = self._update_tables(scheduled)
            positions = range(scheduled.start_position, scheduled.end_position)
            for position, token in zip(positions, scheduled.token_ids, strict=True):
                for group, table in enumerate(tables):
                    block_id = table[position // self.block_size]
                    assert block_id != NULL_BLOCK_ID, "a token was written to the null block"
                    pool = self.manager.pool
                    assert pool.ref_counts[block_id] == 1, "wrote into a shared block"
                    assert not pool.is_cached(block_id), "wrote into a cached block"
                    self.kv[group][self._slot(table, position)] = (position, token)
            if scheduled.do_sample:
                sampled[scheduled.request_id] = self._sample(scheduled, tables)
        return sampled

    def _update_tables(self, scheduled) -> list[list[int]]:
        if scheduled.is_new:
            self.tables[scheduled.request_id] = [[] for _ in self.manager.groups]
        tables = self.tables[scheduled.request_id]
        start = scheduled.block_table_start
        for table, new_ids in zip(tables, scheduled.new_block_ids, strict=True):
            # Like a fixed-width tensor row: overwrite from `start`, keep what lies past the end.
            table[start : start + len(new_ids)] = new_ids
        return tables

    def _slot(self, table: list[int], position: int) -> int:
        return table[position // self.block_size] * self.block_size + position % self.block_size

    def _read(self, tables: list[list[int]], first: int, last: int, group: int) -> list[int]:
        tokens = []
        for position in range(first, last + 1):
            stored = self.kv[group][self._slot(tables[group], position)]
            assert stored is not None and stored[0] == position, (
                f"slot of position {position} in group {group} holds {stored}"
            )
            tokens.append(stored[1])
        return tokens

    def _predict(self, tables: list[list[int]], position: int) -> int:
        """The model's next token after the query at `position`, read through the cache."""
        first_visible = max(0, position - self.window + 1)
        prefix = self._read(tables, 0, position, self.sliding.index(False))
        window_tokens = prefix[first_visible:]
        if True in self.sliding:
            window_tokens = self._read(tables, first_visible, position, self.sliding.index(True))
        return next_token(sum(prefix), window_tokens, position + 1)

    def _sample(self, scheduled, tables) -> list[int]:
        last = scheduled.end_position - 1
        first_query = last - scheduled.num_draft_tokens
        tokens = []
        for position in range(first_query, last + 1):
            predicted = self._predict(tables, position)
            tokens.append(predicted)
            draft_index = position - first_query  # the draft fed at position + 1
            if draft_index >= scheduled.num_draft_tokens:
                break
            draft = scheduled.token_ids[position + 1 - scheduled.start_position]
            if draft != predicted:
                break
        return tokens
