"""KV cache manager invariants under random request lifecycles (hypothesis state machine)."""

from __future__ import annotations

import math

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gossamer.cache import NULL_BLOCK_ID, KVCacheLayout, KVCacheManager
from tests.cache.util import Req, check_refcounts

BLOCK, WINDOW, NUM_BLOCKS = 2, 5, 40
BASE = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]


class ManagerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        layout = KVCacheLayout.from_layer_windows([WINDOW, None])
        self.manager = KVCacheManager.from_layout(layout, NUM_BLOCKS, block_size=BLOCK)
        self.live: dict[str, Req] = {}
        self.counter = 0

    def _new_id(self) -> str:
        self.counter += 1
        return f"r{self.counter}"

    @rule(
        shared=st.integers(0, len(BASE)),
        extra=st.lists(st.integers(0, 3), max_size=6),
        chunk=st.integers(1, 12),
    )
    def admit(self, shared: int, extra: list[int], chunk: int) -> None:
        tokens = BASE[:shared] + extra
        if not tokens:
            return
        request = Req(self._new_id(), tokens)
        hit = self.manager.find_cached_prefix(request)
        assert hit.num_tokens < len(tokens) and hit.num_tokens % BLOCK == 0
        chunk = min(chunk, len(tokens) - hit.num_tokens)
        if self.manager.allocate_slots(request, chunk, hit):
            request.num_computed_tokens = hit.num_tokens
            self.live[request.request_id] = request
            self._computed(request, chunk, accepted=0, drafts=0)
        else:
            assert not self.manager.has_request(request.request_id)

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data(), chunk=st.integers(1, 8), drafts=st.integers(0, 3))
    def step(self, data: st.DataObject, chunk: int, drafts: int) -> None:
        request = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        pending = len(request.all_token_ids) - request.num_computed_tokens
        drafts = drafts if pending == 1 else 0
        chunk = min(chunk, pending) + drafts
        if not self.manager.allocate_slots(request, chunk):
            return
        accepted = data.draw(st.integers(0, drafts))
        self._computed(request, chunk, accepted, drafts)

    def _computed(self, request: Req, chunk: int, accepted: int, drafts: int) -> None:
        """The step ran: computed tokens advance; drafts past `accepted` are rolled back."""
        start = request.num_computed_tokens
        if start + chunk - drafts == len(request.all_token_ids):
            request.all_token_ids.extend([0] * (accepted + 1))
        request.num_computed_tokens = start + chunk - (drafts - accepted)
        if drafts - accepted:
            self.manager.truncate(request.request_id, request.num_computed_tokens)
        self.manager.cache_computed_blocks(request)

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        parent = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        child = Req(self._new_id(), list(parent.all_token_ids))
        shared = self.manager.fork(
            parent.request_id,
            child.request_id,
            min(parent.num_computed_tokens, len(child.all_token_ids) - 1),
        )
        if shared:
            child.num_computed_tokens = shared
            self.live[child.request_id] = child

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        request_id = data.draw(st.sampled_from(sorted(self.live)))
        self.manager.free(request_id)
        del self.live[request_id]

    @invariant()
    def tables_are_consistent(self) -> None:
        check_refcounts(self.manager, list(self.live))
        for request in self.live.values():
            full, sliding = self.manager.block_tables(request.request_id)
            computed = request.num_computed_tokens
            assert len(full) == len(sliding) >= math.ceil(computed / BLOCK)
            assert NULL_BLOCK_ID not in full
            # The next query (position `computed`) must still see keys computed-WINDOW+1 ..
            first_visible = max(0, computed - WINDOW + 1) // BLOCK
            assert NULL_BLOCK_ID not in sliding[first_visible:]

    def teardown(self) -> None:
        for request_id in list(self.live):
            self.manager.free(request_id)
        assert self.manager.num_free_blocks == NUM_BLOCKS - 1


ManagerMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
TestManager = ManagerMachine.TestCase
