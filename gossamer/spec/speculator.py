"""The speculator: the engine's one hook into speculative decoding.

EngineCore calls it twice per step:

1. `sample(logits, items, rows, generator)` when a scheduled request carries draft tokens: verify
   them (gossamer/spec/verify.py) and return accepted drafts + 1 token per request;
2. `after_step(scheduler, scheduled, sampled, row_for)` after `Scheduler.update`: record acceptance,
   forget ended requests, let proposers observe the step, and propose drafts for the next step with
   `Scheduler.set_draft_tokens`. The scheduler counts drafts in the token budget, drops them when
   the budget or the KV cache is short, and rolls back the KV of rejected ones.

Idle batches: `idle_for(batch)` says when no request of a batch would get a draft (the batch limit,
the measured guard, or a cost model that finds no k paying even at the best acceptance seen).
Then the engine runs as without a speculator, but for the speculator's bookkeeping of each step:
with overlapped scheduling its plain decode steps overlap (`may_run_ahead`), and
`after_step(..., next_in_flight=True)` proposes nothing, since the next step already runs
(drafts made now would miss the token of the step in flight). Proposers still observe every step.
The first synchronous step after the overlap ends (an arrival, a finish, the batch no longer
idle) proposes as usual; proposers build their per-request indexes at a request's first proposal,
so requests that only ran while idle never pay for one.

When to speculate:
- only for requests at the end of their known tokens (decodes), at most `num_speculative_tokens`
  drafts and never past max_tokens;
- not at all while `disable_by_batch_size` or more requests run (a large batch is compute bound,
  so verifying k extra tokens per request is no longer free);
- per request, not while its recent acceptance rate (an exponential average over about
  `acceptance_window` proposals) is below `min_acceptance_rate`: it stays off for `retry_after`
  engine steps, doubled at each relapse (capped at 16x), then tries again;
- "auto": every configured proposer is a candidate; each request ranks them by an exponential
  average of the tokens they got accepted for it (untried ones rank first, in config order),
  and falls through to the next when one has nothing to propose. With the cost model
  (`cost_aware`, on for "auto" by default) the ranking is by the tokens its per-position
  acceptance estimates promise, and the number of drafts k per step (0: none) is the one with
  the most expected tokens per unit of step cost (gossamer/spec/cost.py): an upper bound before
  proposing, the final k once the drafts are known. The speculator times what that model needs:
  each proposer's host time per request (its calls with only requests it proposed for before:
  a first proposal builds per-request indexes once) and the engine's step (from the end of one
  `after_step` to the start of the next, decode-only steps); `calibrate` times the runner's
  verification steps at start-up (gossamer/spec/calibrate.py).
- the measured guard (`measured_guard`, on for "auto" by default; gossamer/spec/guard.py): per
  batch-size bucket, the wall time of whole engine steps (from one `after_step` to the next, so
  proposing and every per-step host cost is in it; a request's index build is charged spread
  over its expected decode steps) and the tokens each request got, in windows of steps it let
  speculate and of steps it kept plain; where requests wait less per token in plain steps, the
  bucket does not speculate at all (no proposer runs) but for a short window now and then that
  measures again. `cycle_observer` sees every step's verdict
  (benchmarks/guard_accounting.py).

Tree drafts (`tree` in the config, draft and eagle3 only; gossamer/spec/tree.py): a draft is a
tree of top-k guesses, fed in breadth-first order; `tree_mask` gives the engine each request's
attention masks for the runner, `sample` verifies down the tree, and `keep_accepted_kv` copies
the accepted path's KV to a chain's slots before the scheduler rolls back the rest. Tree steps
are never padded (no graph holds a tree mask).

Padding (`pad_drafts`): once any decode of the next step has a draft, every decode gets drafts of
one length (the smallest of `draft_len_ladder` that holds the longest draft), the missing ones
filled with filler that `sample` never verifies. The step then has the uniform (batch, 1 + k) shape
a captured CUDA graph replays instead of running eagerly. No padding while a prompt is still being
computed (that step is eager anyway), above the batch sizes multi-token graphs exist for, or when
the padded step would not fit the token budget.
"""

from __future__ import annotations

import math
import operator
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from gossamer.runner.model_runner import MAX_MULTI_TOKEN_GRAPH_SEQS, SeqInput, uniform_query_len
from gossamer.runner.sampler import SamplingRow, TokenLogprobs
from gossamer.scheduler import Request, ScheduledRequest, Scheduler, SchedulerOutput
from gossamer.spec.calibrate import Timer, calibrated_cost_table
from gossamer.spec.config import SpecConfig
from gossamer.spec.cost import DraftLengthChooser
from gossamer.spec.guard import WARM_UP, MeasuredGuard
from gossamer.spec.metrics import SpecMetrics
from gossamer.spec.proposer import BaseProposer, Draft, Proposer, SpecRequest
from gossamer.spec.tree import ancestor_masks, move_accepted_kv, node_depths, tree_depth
from gossamer.spec.verify import verify

# Steps an idle verdict of the cost model stands for (Speculator.idle_for) before it is judged again.
IDLE_REFRESH_STEPS = 16
# Proposers' deferred work while the engine waits for the GPU (`background_work`); env 0 turns it
# off for A/B runs (its overshoot past the GPU's step is unmeasured on the device: session 10).
BACKGROUND_WORK = os.environ.get("GOSSAMER_SPEC_BACKGROUND", "1") != "0"
# Why a batch is idle (Speculator._idle_reason).
BATCH_TOO_LARGE = "batch too large"
GUARD_OFF = "guard off"
COST_OFF = "cost off"
# Why the measured guard took no sample of a step (GuardCycle.verdict; the guard's own verdicts
# are in gossamer/spec/guard.py).
NOT_CONSULTED = "no mode"  # the guard did not decide the step's mode
OVERLAP_END = "ends an overlap"  # launched before the previous after_step: its time is a tail
PROMPT_CHUNK = "prompt chunk"  # it computed a prompt chunk too


@dataclass(frozen=True)
class GuardCycle:
    """One engine step as the measured guard saw it (`Speculator.cycle_observer`): from `start`
    (the previous after_step's start; None where unknown) to `end` (this after_step's start),
    `batch` scheduled requests, the guard's `mode` for it (None: not consulted), whether it
    verified drafts, what the guard made of it (`verdict`) and the tokens each request got."""

    start: float | None
    end: float
    batch: int
    mode: bool | None
    drafted: bool
    verdict: str
    request_tokens: Mapping[str, int]

    @property
    def tokens(self) -> int:
        """The tokens the step emitted, in all."""
        return sum(self.request_tokens.values())


@dataclass
class _RequestState:
    acceptance: float = 1.0  # exponential average of accepted / drafted
    num_verified: int = 0
    off_until: int = 0  # speculation step counter value from which it may propose again
    backoff: int = 0
    scores: dict[str, float] = field(default_factory=dict)  # method -> avg accepted tokens


class Speculator:
    def __init__(
        self,
        config: SpecConfig,
        proposers: dict[str, Proposer],
        clock: Timer = time.perf_counter,
    ) -> None:
        """`clock`: what the speculator times steps and proposers with (tests inject a fake)."""
        if not proposers:
            raise ValueError("a speculator needs at least one proposer")
        self.config = config
        self.proposers = proposers  # in preference order for ties
        # those that look at every step (EAGLE-3's hidden states): the others' `observe` is the
        # base no-op, and an idle step then skips building what it would be given
        self._observers = [p for p in proposers.values() if _observes(p)]
        self._background = [p for p in proposers.values() if _works_in_background(p)]
        if not BACKGROUND_WORK:
            self._background = []
        self.metrics = SpecMetrics(config.num_speculative_tokens)
        # A ModelRunner subclass the target must run with (EAGLE-3 needs hidden states), or None.
        self.target_runner_class = None
        self._alpha = 2 / (config.acceptance_window + 1)
        self._states: dict[str, _RequestState] = {}
        self._pending: dict[str, tuple[str, Draft]] = {}  # drafts handed to the scheduler
        self._tracked: dict[str, Request] = {}  # requests some proposer may hold state for
        # the last verification's accepted tree paths: request id -> (index in its batch, nodes)
        self._tree_paths: dict[str, tuple[int, list[int]]] = {}
        self._step = 0
        self._proposed_for: dict[str, set[str]] = defaultdict(set)  # method -> request ids
        self.clock = clock
        self._step_done: float | None = None  # clock at the end of the last after_step
        self._cycle_start: float | None = None  # clock at the start of the last after_step
        # the guard's decision for the step in flight (None: not consulted, no sample), and the
        # requests whose index proposing for it built (id -> tokens it may still get: the guard
        # amortizes the build over them)
        self._step_mode: bool | None = None
        self._built: dict[str, float] = {}
        # batch size -> (step, whether some k could pay there): the cost model's idle verdict
        self._pays_at: dict[int, tuple[int, bool]] = {}
        self._ran_ahead = False  # the last after_step had the next step in flight
        self._stats: dict[str, float] | None = None  # the last `stats` (None: make all again)
        self._propose_time_names = {m: f"{m}_propose_us_per_request" for m in proposers}
        self._guard_stats: dict[str, float] | None = None  # the guard's, as in `_stats`
        self.guard = None
        # called with a GuardCycle after every step while the guard runs (diagnostics:
        # benchmarks/guard_accounting.py)
        self.cycle_observer: Callable[[GuardCycle], None] | None = None
        if config.guards_speculation:
            self.guard = MeasuredGuard(
                config.explore_every, config.explore_steps, config.guard_margin
            )
        self.chooser = None  # cost-aware k (gossamer/spec/cost.py)
        self.measured_cost_table = None  # what `calibrate` timed (ms), if it did
        self.calibration_seconds = 0.0
        if config.chooses_k:
            self.chooser = DraftLengthChooser(
                config.cost_table,
                config.draft_len_ladder,
                config.num_speculative_tokens,
                config.acceptance_window,
            )

    def calibrate(self, runner, num_blocks: int, timer: Timer = time.perf_counter) -> None:
        """At engine start-up, once `runner` captured its graphs: time its verification steps for
        the cost model (gossamer/spec/calibrate.py). Nothing without the cost model, with an
        explicit cost_table (it wins) or without CUDA graphs (the built-in table stays)."""
        if self.chooser is None:
            return
        self._stats = None
        start = time.perf_counter()
        table = calibrated_cost_table(self.config, runner, num_blocks, timer)
        if table is not None:
            self.chooser.use_measured_table(table)
            self.measured_cost_table = table
            self.calibration_seconds = time.perf_counter() - start

    # ---- verification ------------------------------------------------------------------------

    def sample(
        self,
        logits: torch.Tensor,  # [sum(num_draft_tokens + 1), vocab]
        items: Sequence[ScheduledRequest],  # the scheduled requests with do_sample, in order
        rows: Sequence[SamplingRow],
        shared_generator: torch.Generator,
    ) -> tuple[list[list[int]], list[list[TokenLogprobs | None]]]:
        self._stats = None
        drafts, draft_probs, parents, kept_rows = [], [], [], []
        offset = 0
        for item in items:
            draft = self._real_draft(item)
            drafts.append(draft)
            draft_probs.append(self._draft_probs(item.request_id, draft))
            parents.append(self._draft_parents(item.request_id, draft))
            kept_rows.extend(range(offset, offset + len(draft) + 1))
            offset += item.num_draft_tokens + 1
        logits_rows = None
        if len(kept_rows) < offset:
            # NOTE: filler rows were computed only to keep the step's shape uniform. Verifying the
            # real drafts alone caps acceptance at their length; the scheduler rolls the filler's
            # KV back with the rejected tokens'.
            self.metrics.num_padding_tokens += offset - len(kept_rows)
            logits_rows = kept_rows
        verified = verify(logits, rows, drafts, draft_probs, shared_generator, parents, logits_rows)
        self._tree_paths = {
            item.request_id: (index, path)
            for index, (item, tree, path) in enumerate(
                zip(items, parents, verified.paths, strict=True)
            )
            if tree is not None
        }
        return verified.tokens, verified.logprobs

    def tree_mask(self, item: ScheduledRequest) -> tuple[int, ...] | None:
        """The attention masks of a step that verifies the request's tree draft (root first),
        for the runner (`SeqInput.tree_mask`); None for chains and steps without drafts."""
        pending = self._pending.get(item.request_id)
        if pending is None or pending[1].parents is None:
            return None  # a chain, or no draft (the common case: no slicing)
        draft = self._real_draft(item)
        parents = self._draft_parents(item.request_id, draft)
        return None if parents is None else ancestor_masks(parents, with_root=True)

    def keep_accepted_kv(self, kv_cache: torch.Tensor, seqs: Sequence[SeqInput]) -> None:
        """After `sample`: copy the KV of each accepted tree path to the slots a chain would
        have used (the scheduler then keeps them and rolls back the rest). `seqs`: the step's
        inputs of the requests `sample` verified, in its order."""
        moves = [
            (seqs[index].block_tables, seqs[index].start, path)
            for index, path in self._tree_paths.values()
            if path
        ]
        if moves:
            move_accepted_kv(kv_cache, moves)

    def _real_draft(self, item: ScheduledRequest) -> list[int]:
        """The proposed drafts the step fed, without padding filler (the scheduler may have cut
        the tail of the drafts for budget or blocks, the filler first)."""
        pending = self._pending.get(item.request_id)
        if pending is None or not item.num_draft_tokens:
            return []
        count = min(len(pending[1].token_ids), item.num_draft_tokens)
        start = len(item.token_ids) - item.num_draft_tokens
        return item.token_ids[start : start + count]

    def record_step_shape(self, seqs: Sequence[SeqInput]) -> None:
        """Count a verification step as uniform (a CUDA graph can replay it), ragged (decodes
        only, draft lengths differ), mixed with a prompt chunk (never a graph) or a tree step."""
        self._stats = None
        if any(seq.tree_mask is not None for seq in seqs):
            self.metrics.num_tree_verify_steps += 1
        elif uniform_query_len(list(seqs)) is not None:
            self.metrics.num_uniform_verify_steps += 1
        elif any(seq.num_logits < len(seq.token_ids) for seq in seqs):
            self.metrics.num_prefill_verify_steps += 1
        else:
            self.metrics.num_ragged_verify_steps += 1

    def _draft_probs(self, request_id: str, draft: list[int]) -> torch.Tensor | None:
        pending = self._pending.get(request_id)
        if not draft or pending is None or pending[1].probs is None:
            return None
        proposed = pending[1]
        # NOTE: a draft drawn from q must be verified against that q, never as a point mass.
        if proposed.token_ids[: len(draft)] != draft:
            raise RuntimeError(f"draft tokens of {request_id!r} changed between propose and verify")
        return proposed.probs[: len(draft)]

    def _draft_parents(self, request_id: str, draft: list[int]) -> list[int] | None:
        """The parents of a tree draft's first len(draft) nodes (the scheduler may have cut
        the tail: breadth-first order keeps the rest a tree); None for a chain."""
        pending = self._pending.get(request_id)
        if not draft or pending is None or pending[1].parents is None:
            return None
        return pending[1].parents[: len(draft)]

    # ---- after the step ----------------------------------------------------------------------

    def after_step(
        self,
        scheduler: Scheduler,
        scheduled: SchedulerOutput,
        sampled: dict[str, list[int]],
        row_for: Callable[[str], SamplingRow | None],
        next_in_flight: bool = False,
    ) -> None:
        """`next_in_flight`: the engine launched the next step before this one's tokens reached
        the host (overlapped scheduling, while `may_run_ahead`). That step runs plain; drafts
        proposed now would not include this step's token, so none are.

        Such a step, with no drafts pending and no proposer observing steps, is an idle one: its
        bookkeeping loops over the requests only where the guard measures it or a request is
        new or ended, and `stats` then writes again only what an idle step changes."""
        now = self.clock()
        if next_in_flight and self._ran_ahead and self._idle_tick(scheduler, scheduled, now):
            return
        if not (next_in_flight and self._only_bookkeeping()):
            self._stats = None  # (anything may have changed: stats() makes them all again)
        self._end_overlap(next_in_flight)
        # NOTE: a step applied while the next one runs was itself launched ahead, and the engine
        # launches only plain decode steps ahead (gossamer/engine/overlap.py): decode-only
        decode_only = next_in_flight or _decode_only(scheduled.scheduled_requests)
        self._record_step_time(scheduled, decode_only, now)
        self._record_cycle(scheduled, sampled, decode_only, now)
        self._cycle_start = now
        if self._built:  # (only a proposing step builds: idle steps allocate no new dict)
            self._built = {}
        self._step += 1
        if self._pending:  # (drafts were verified in this step)
            self._record(scheduled, sampled)
        if len(self._tracked) > scheduler.num_running:  # (else none of them can have ended)
            self._release_ended(scheduler)
        live = self._track(scheduler, scheduled, sampled)
        if self._tree_paths:
            paths = {request_id: path for request_id, (_, path) in self._tree_paths.items()}
            self._tree_paths = {}
            for proposer in self.proposers.values():
                proposer.accepted_paths(paths)
        for proposer in self._observers:
            proposer.observe(scheduled, live)
        if next_in_flight:
            self._count_overlapped_step(scheduler)
        else:
            self._propose(scheduler, row_for)
        self._step_done = self.clock()

    def _idle_tick(self, scheduler: Scheduler, scheduled: SchedulerOutput, now: float) -> bool:
        """The whole of an idle step's after_step where it is only counting, in one call: the
        step just done ran plain and was launched ahead, as is the next one; no drafts, tree paths,
        observers, index builds or cycle observer; no request of it is new or has ended; and its
        guard window leaves it unmeasured. Returns False (having changed nothing) where any of that
        does not hold, and the full after_step runs. (The requests of a continuation step were all
        in the step before, whose after_step tracked them.) Measured on the CPU oracle made host
        bound (guard_accounting.py --device-ms-scale 0.1, batch 8, ~0.2 ms steps): the full path
        took ~13 us of such a step, this one ~6 us."""
        items = scheduled.scheduled_requests
        if (
            self._step_mode is not False
            or self._built
            or self.cycle_observer is not None
            or not self._only_bookkeeping()
            or len(self._tracked) > scheduler.num_running
            or self._cycle_start is None
            or not scheduled.continuation  # (else a request may be new: `_track`)
            or (self.guard is not None and not self.guard.skips(len(items), False))
        ):
            return False
        if self.chooser is not None and self._step_done is not None:
            self.chooser.record_step_time(len(items), 0, now - self._step_done)
        self._step_mode = None
        self._cycle_start = now
        self._step += 1
        self._count_overlapped_step(scheduler)
        self._step_done = self.clock()
        return True

    def _only_bookkeeping(self) -> bool:
        """Whether a step applied while the next one runs leaves the speculator nothing but its
        bookkeeping: no drafts were pending, no tree path is to pass on, no proposer observes."""
        return not (self._pending or self._tree_paths or self._observers)

    def _track(
        self, scheduler: Scheduler, scheduled: SchedulerOutput, sampled: Mapping[str, object]
    ) -> dict[str, list[int]]:
        """Tracks the step's requests (proposers may hold state for them until they end);
        returns each live one's tokens where some proposer observes steps (else {})."""
        observed = bool(self._observers)
        if not observed and self._tracks_all(scheduler, scheduled, sampled):
            return {}  # (the common case: nothing new)
        live = {}
        for item in scheduled.scheduled_requests:
            request_id = item.request_id
            request = scheduler.get_request(request_id)
            if request is None:
                continue
            known = self._tracked.get(request_id)
            if known is not request:
                if known is not None:  # an ended request's id came back before it was released
                    self._release(request_id, known)
                self._tracked[request_id] = request
            if observed:
                live[request_id] = request.all_token_ids
        return live

    def _tracks_all(
        self, scheduler: Scheduler, scheduled: SchedulerOutput, sampled: Mapping[str, object]
    ) -> bool:
        """Whether each request of the step is tracked as the very request the scheduler holds
        under its id (or neither holds it): then `_track` has nothing to do. Compared without a
        Python loop, over `sampled`'s ids where every request of the step sampled."""
        ids: Iterable[str] = sampled
        if len(sampled) != len(scheduled.scheduled_requests):
            ids = [item.request_id for item in scheduled.scheduled_requests]
        tracked = map(self._tracked.get, ids)
        held = map(scheduler.requests.get, ids)
        return all(map(operator.is_, tracked, held))

    def _end_overlap(self, next_in_flight: bool) -> None:
        """The step that ends an overlap was launched before the previous after_step: the time
        since then is only its tail, so neither the step time nor the guard take a sample."""
        if self._ran_ahead and not next_in_flight:
            self._step_done = self._cycle_start = None
        self._ran_ahead = next_in_flight

    def _record_step_time(self, scheduled: SchedulerOutput, decode_only: bool, now: float) -> None:
        """The engine's step since the last after_step: the plain step time the cost model
        converts host time with. Steps with a prompt chunk (and the idle time before one) are
        left out."""
        items = scheduled.scheduled_requests
        if self.chooser is None or self._step_done is None or not decode_only:
            return
        # (drafts were scheduled only where some are pending)
        num_drafts = sum(item.num_draft_tokens for item in items) if self._pending else 0
        self.chooser.record_step_time(len(items), num_drafts, now - self._step_done)

    def _record_cycle(
        self,
        scheduled: SchedulerOutput,
        sampled: dict[str, list[int]],
        decode_only: bool,
        now: float,
    ) -> None:
        """For the measured guard: the step just done, from the start of the previous after_step
        (which proposed for it, or not) to now, and the tokens each request got. Steps with a
        prompt chunk are left out; those whose proposing built an index are charged it
        amortized (gossamer/spec/guard.py)."""
        items = scheduled.scheduled_requests
        mode, start = self._step_mode, self._cycle_start
        self._step_mode = None
        if self.guard is None:
            return
        verdict = self._unsampled_reason(decode_only, mode, start)
        if verdict is None and not self._built and self.guard.skips(len(items), mode):
            verdict = WARM_UP  # (a long plain window's unmeasured steps: no per-request work)
        if verdict is not None and self.cycle_observer is None:
            return  # (steps the guard does not sample, e.g. idle overlapped ones: no per-request work)
        tokens = {item.request_id: len(sampled.get(item.request_id, ())) for item in items}
        if verdict is None:
            verdict = self.guard.record(mode, now - start, tokens, self._built)
        if self.cycle_observer is not None:
            drafted = any(item.num_draft_tokens for item in items)
            self.cycle_observer(GuardCycle(start, now, len(items), mode, drafted, verdict, tokens))

    @staticmethod
    def _unsampled_reason(decode_only: bool, mode: bool | None, start: float | None) -> str | None:
        """Why the guard takes no sample of the step just done (None: it does). A step whose
        proposing built an index is a sample: that is what speculating costs a new request."""
        if not decode_only:
            return PROMPT_CHUNK
        if mode is None:
            return NOT_CONSULTED
        if start is None:
            return OVERLAP_END
        return None

    def _record(self, scheduled: SchedulerOutput, sampled: dict[str, list[int]]) -> None:
        for item in scheduled.scheduled_requests:
            if not item.do_sample:
                continue
            pending = self._pending.pop(item.request_id, None)
            tokens = sampled.get(item.request_id)
            if not item.num_draft_tokens or pending is None or not tokens:
                continue
            method, num_accepted = pending[0], len(tokens) - 1
            num_drafted = min(len(pending[1].token_ids), item.num_draft_tokens)
            depth = None
            if pending[1].parents is not None:  # a tree: acceptance is judged against its depth
                depth = tree_depth(pending[1].parents[:num_drafted])
            self.metrics.record(method, num_drafted, num_accepted, depth)
            num_positions = num_drafted if depth is None else depth
            self.proposers[method].feedback(item.request_id, num_positions, num_accepted)
            self._update_state(item.request_id, method, num_positions, num_accepted)

    def _update_state(self, request_id: str, method: str, drafted: int, accepted: int) -> None:
        state = self._states.setdefault(request_id, _RequestState())
        alpha = self._alpha
        state.acceptance += alpha * (accepted / drafted - state.acceptance)
        previous = state.scores.get(method, float(accepted))
        state.scores[method] = previous + alpha * (accepted - previous)
        state.num_verified += 1
        if self.chooser is not None:
            self.chooser.record(request_id, method, drafted, accepted, self._step)
        config = self.config
        warmed_up = state.num_verified >= max(1, config.acceptance_window // 2)
        if warmed_up and state.acceptance < config.min_acceptance_rate:
            state.backoff = min(2 * state.backoff or config.retry_after, 16 * config.retry_after)
            state.off_until = self._step + state.backoff
            state.acceptance, state.num_verified = 1.0, 0
            self.metrics.num_disabled_requests += 1

    def _release_ended(self, scheduler: Scheduler) -> None:
        for request_id, request in list(self._tracked.items()):
            if scheduler.get_request(request_id) is not request:
                self._release(request_id, request)

    def _release(self, request_id: str, request: Request) -> None:
        """The request ended: every proposer and record lets go of it."""
        del self._tracked[request_id]
        self._states.pop(request_id, None)
        self._pending.pop(request_id, None)
        for requests in self._proposed_for.values():
            requests.discard(request_id)
        if self.chooser is not None:
            self.chooser.forget(request_id)
        for proposer in self.proposers.values():
            proposer.release(request_id, request.all_token_ids, request.num_prompt_tokens)

    # ---- idle batches --------------------------------------------------------------------------

    def idle_for(self, num_decodes: int, token_budget: int | None = None) -> bool:
        """Whether no request would get a draft in a step of `num_decodes` decodes: the batch
        reached disable_by_batch_size, the measured guard keeps its bucket plain, or the cost
        model finds that no k could pay there even if every request were accepted at the best
        method's rates over all requests (`can_pay`, with the cheapest proposer's host time;
        `token_budget`: the scheduler's). A request whose own record beats that loses its drafts
        while the batch stays idle. Cheap enough for every step: the cost verdict is kept per
        batch size for IDLE_REFRESH_STEPS steps, while the rates and host times it reads fade
        back toward trying again."""
        return self._idle_reason(num_decodes, token_budget) is not None

    def background_work(self) -> bool:
        """One small chunk of the proposers' deferred work (index upkeep); whether any is left.
        The engine calls it while it waits for the GPU (overlap.py), so that work costs no step
        time where the host is ahead of the GPU."""
        more = False
        for proposer in self._background:
            more = proposer.background_work() or more
        return more

    def may_run_ahead(self, num_decodes: int, token_budget: int | None = None) -> bool:
        """Whether the engine may launch the next step of `num_decodes` decodes before this
        one's tokens reach the host (overlapped scheduling): idle at that batch, and no proposer
        reads the target's outputs of each step (EAGLE-3 observes the hidden states of the step
        just run, which the next one would overwrite)."""
        return self.target_runner_class is None and self.idle_for(num_decodes, token_budget)

    def _idle_reason(self, num_decodes: int, token_budget: int | None) -> str | None:
        limit = self.config.disable_by_batch_size
        if limit is not None and num_decodes >= limit:
            return BATCH_TOO_LARGE
        if self.guard is not None and num_decodes and not self.guard.allows(num_decodes):
            return GUARD_OFF
        if self.chooser is not None and not self._cost_pays(num_decodes, token_budget):
            return COST_OFF
        return None

    def _cost_pays(self, num_decodes: int, token_budget: int | None) -> bool:
        """The cost model's verdict for the batch size, judged again every IDLE_REFRESH_STEPS
        steps: what it reads drifts slowly, and a verdict judged every step could flap."""
        cached = self._pays_at.get(num_decodes)
        if cached is not None and self._step - cached[0] < IDLE_REFRESH_STEPS:
            return cached[1]
        # a decode-only step is padded where the proposing step would pad it (_can_pad)
        padded = self.config.pad_drafts and num_decodes <= MAX_MULTI_TOKEN_GRAPH_SEQS
        host = self._cheapest_proposing()
        pays = self.chooser.can_pay(num_decodes, padded, token_budget, self._step, host)
        self._pays_at[num_decodes] = (self._step, pays)
        return pays

    def _cheapest_proposing(self) -> float:
        """Seconds per request of the fastest proposer (0 when host time is not charged)."""
        if not self.config.charge_proposer_time:
            return 0.0
        times = self.chooser.proposer_time
        return min(times.per_request(method, self._step) for method in self.proposers)

    def _count_overlapped_step(self, scheduler: Scheduler) -> None:
        """The step in flight was launched plain while idle: count it, also under the reason
        the batch is idle (as a proposing step would be). Where the guard is that reason, the
        step is a plain sample of its bucket, as a plain step it chose would be."""
        self.metrics.num_idle_overlapped_steps += 1
        reason = self._idle_reason(scheduler.num_running, scheduler.max_num_batched_tokens)
        self._count_off_step(reason)
        if reason == GUARD_OFF:
            self._step_mode = False

    def _count_off_step(self, reason: str | None) -> None:
        if reason == BATCH_TOO_LARGE:
            self.metrics.num_disabled_steps += 1
        elif reason == GUARD_OFF:
            self.metrics.num_guard_off_steps += 1
        elif reason == COST_OFF:
            self.metrics.num_cost_off_steps += 1

    # ---- proposing ---------------------------------------------------------------------------

    def _propose(self, scheduler: Scheduler, row_for: Callable[[str], SamplingRow | None]) -> None:
        limit = self.config.disable_by_batch_size
        if limit is not None and scheduler.num_running >= limit:
            self.metrics.num_disabled_steps += 1
            return
        num_decodes = _num_decodes(scheduler)  # the next step's (proposers change no request)
        if not self._guard_allows(num_decodes):
            return
        candidates = [
            spec
            for request in scheduler.running
            if (spec := self._candidate(scheduler, request, row_for))
        ]
        padded = self._can_pad(scheduler, num_decodes)
        if self.chooser is None:
            drafts = self._collect(candidates)
        else:
            drafts = self._collect_cost_aware(scheduler, candidates, padded, num_decodes)
        self._hand_over(scheduler, drafts, padded)

    def _guard_allows(self, num_decodes: int) -> bool:
        """The measured guard's decision for the next step (True without a guard)."""
        if self.guard is None or not num_decodes:
            return True
        self._step_mode = self.guard.allows(num_decodes)
        if not self._step_mode:
            self.metrics.num_guard_off_steps += 1
        return self._step_mode

    def _collect_cost_aware(
        self,
        scheduler: Scheduler,
        candidates: list[SpecRequest],
        padded: bool,
        num_decodes: int,
    ) -> dict[str, tuple[str, Draft]]:
        """Drafts of the lengths the cost model prefers: an upper bound before proposing (less
        proposer work, none at all for k = 0), the final lengths once the drafts are known."""
        rankings = self._rankings(candidates)  # one per request and step: the same rates
        wanted = [(s.request_id, rankings[s.request_id][0], s.max_draft_tokens) for s in candidates]
        charge_host = self.config.charge_proposer_time  # still to be spent: it may not pay
        limits = self._choose(scheduler, padded, wanted, num_decodes, charge_host)
        candidates = [_with_limit(spec, k) for spec, k in zip(candidates, limits, strict=True) if k]
        drafts = self._collect(candidates, rankings)
        found = [(rid, method, len(draft.token_ids)) for rid, (method, draft) in drafts.items()]
        lens = self._choose(scheduler, padded, found, num_decodes)
        return {
            request_id: (method, _truncated(draft, k))
            for (request_id, (method, draft)), k in zip(drafts.items(), lens, strict=True)
            if k
        }

    def _choose(
        self,
        scheduler: Scheduler,
        padded: bool,
        wanted: list[tuple[str, str, int]],
        num_decodes: int,
        charge_host: bool = False,
    ) -> list[int]:
        budget = scheduler.max_num_batched_tokens
        lens = self.chooser.choose(wanted, num_decodes, padded, budget, self._step, charge_host)
        if wanted and not any(lens):
            self.metrics.num_cost_off_steps += 1
        return lens

    def _rankings(self, candidates: list[SpecRequest]) -> dict[str, list[str]]:
        methods = list(self.proposers)
        return {spec.request_id: self._ranking(spec.request_id, methods) for spec in candidates}

    def _collect(
        self, candidates: list[SpecRequest], rankings: dict[str, list[str]] | None = None
    ) -> dict[str, tuple[str, Draft]]:
        """request id -> (method, draft) for the candidates some proposer has a draft for, each
        asking its proposers in its ranking's order (`rankings`: already known, by request)."""
        drafts: dict[str, tuple[str, Draft]] = {}
        methods = list(self.proposers)
        if rankings is None:
            rankings = self._rankings(candidates)
        for round_index in range(len(methods)):
            groups: dict[str, list[SpecRequest]] = defaultdict(list)
            for spec in candidates:
                groups[rankings[spec.request_id][round_index]].append(spec)
            candidates = []
            for method, group in groups.items():
                for spec, draft in zip(group, self._timed_propose(method, group), strict=True):
                    if draft is not None and draft.token_ids:
                        drafts[spec.request_id] = (method, _truncated(draft, spec.max_draft_tokens))
                    else:
                        candidates.append(spec)
            if not candidates:
                break
        return drafts

    def _timed_propose(self, method: str, group: list[SpecRequest]) -> list[Draft | None]:
        """The proposer's drafts for `group`, its host time per request recorded for the cost
        model when every request of the group had a proposal of it before (a first proposal
        may build the request's index: a one-off cost, not what each step pays)."""
        start = self.clock()
        drafts = self.proposers[method].propose(group)
        seconds = self.clock() - start
        seen = self._proposed_for[method]
        new = [spec.request_id for spec in group if spec.request_id not in seen]
        if new:
            self._note_builds(new)
        elif self.chooser is not None:
            self.chooser.record_proposer_time(method, seconds, len(group), self._step)
        seen.update(spec.request_id for spec in group)
        return drafts

    def _note_builds(self, request_ids: list[str]) -> None:
        """Requests whose index a first proposal built, with the tokens each may still get (the
        guard amortizes the build over them; math.inf where max_tokens is unknown)."""
        for request_id in request_ids:
            request = self._tracked.get(request_id)
            left = math.inf
            if request is not None and request.max_tokens is not None:
                left = max(request.max_tokens - len(request.output_token_ids), 1)
            self._built[request_id] = left

    def _candidate(
        self,
        scheduler: Scheduler,
        request: Request,
        row_for: Callable[[str], SamplingRow | None],
    ) -> SpecRequest | None:
        if request.num_computed_tokens != request.num_tokens - 1:
            return None  # prompt not done yet
        state = self._states.get(request.request_id)
        if state is not None and state.off_until > self._step:
            return None
        max_drafts = self.config.num_speculative_tokens
        if request.max_tokens is not None:
            max_drafts = min(max_drafts, request.max_tokens - len(request.output_token_ids) - 1)
        if scheduler.max_model_len is not None:
            max_drafts = min(max_drafts, scheduler.max_model_len - request.num_tokens)
        row = row_for(request.request_id) if max_drafts >= 1 else None
        if row is None:
            return None
        self._tracked[request.request_id] = request
        return SpecRequest(
            request.request_id,
            request.all_token_ids,
            request.num_prompt_tokens,
            max_drafts,
            row,
        )

    def _ranking(self, request_id: str, methods: list[str]) -> list[str]:
        if len(methods) == 1:
            return methods
        if self.chooser is not None:  # by the estimates the cost model decides with
            chooser, step = self.chooser, self._step
            return sorted(
                methods, key=lambda method: -chooser.expected_accepted(request_id, method, step)
            )
        state = self._states.get(request_id)
        scores = state.scores if state is not None else {}
        untried = float(self.config.num_speculative_tokens + 1)
        # stable sort: equal scores keep the config order (cheap proposers first)
        return sorted(methods, key=lambda method: -scores.get(method, untried))

    def _hand_over(
        self, scheduler: Scheduler, drafts: dict[str, tuple[str, Draft]], padded: bool
    ) -> None:
        """Give the scheduler the drafts. When `padded`, every decode gets drafts of one length
        (the smallest of the ladder that holds the longest draft), filler where its own are
        short or missing, provided the padded step fits the token budget."""
        self._pending.update(drafts)
        length = self._padded_length(scheduler, drafts) if padded else 0
        if not length:
            for request_id, (_, draft) in drafts.items():
                scheduler.set_draft_tokens(request_id, list(draft.token_ids))
            return
        for request in scheduler.running:
            entry = drafts.get(request.request_id)
            tokens = list(entry[1].token_ids) if entry is not None else []
            # any token id would do as filler: it is fed and scored but never verified
            filler = tokens[-1] if tokens else request.all_token_ids[-1]
            scheduler.set_draft_tokens(
                request.request_id, tokens + [filler] * (length - len(tokens))
            )

    def _can_pad(self, scheduler: Scheduler, num_decodes: int) -> bool:
        """Whether padding could make the next step uniform and so replay a graph: not while a
        prompt is still being computed (that step runs eagerly anyway) nor above the batch sizes
        multi-token graphs exist for. EAGLE-3's target runner captures graphs too (they return
        its hidden states next to the logits), so its steps are padded like any other. Tree
        steps are never padded: no graph holds a tree mask."""
        running = scheduler.running
        if not self.config.pad_drafts or self.config.tree is not None:
            return False
        if len(running) > MAX_MULTI_TOKEN_GRAPH_SEQS:
            return False
        return num_decodes == len(running)

    def _padded_length(self, scheduler: Scheduler, drafts: dict[str, tuple[str, Draft]]) -> int:
        """The common draft length, or 0 when nothing is drafted or the padded step would not
        fit the token budget (the scheduler would cut it into a ragged one)."""
        if not drafts:
            return 0
        longest = max(len(draft.token_ids) for _, draft in drafts.values())
        length = next(k for k in self.config.draft_len_ladder if k >= longest)
        fits = len(scheduler.running) * (1 + length) <= scheduler.max_num_batched_tokens
        return length if fits else 0

    # ---- stats -------------------------------------------------------------------------------

    def stats(self) -> dict[str, float]:
        """The counters, and with the cost model the times it converts host time with: the
        plain step and each method's proposing per request (microseconds, 0 while unknown).

        NOTE: the engine reads them after every step. After an idle step (after_step) only what
        such a step changes is written again (the counters of idle steps, the times, the guard's
        stats), into a copy of the last ones: a dict handed out never changes, so a reader holds a
        snapshot. After any other step, `sample` or `calibrate` they are all made again."""
        if self._stats is None:
            stats = self._all_stats()
        else:
            stats = self._stats.copy()
            metrics = self.metrics  # (what _count_overlapped_step counts)
            stats["num_idle_overlapped_steps"] = metrics.num_idle_overlapped_steps
            stats["num_disabled_steps"] = metrics.num_disabled_steps
            stats["num_guard_off_steps"] = metrics.num_guard_off_steps
            stats["num_cost_off_steps"] = metrics.num_cost_off_steps
            self._add_times(stats)
        guard_stats = self.guard.stats() if self.guard is not None else None
        if guard_stats is not self._guard_stats:  # (the guard made them again)
            stats |= guard_stats
            self._guard_stats = guard_stats
        self._stats = stats
        return stats

    def _all_stats(self) -> dict[str, float]:
        """`stats`, all made again."""
        stats = self.metrics.as_dict()
        self._add_times(stats)
        if self.guard is not None:
            stats |= self.guard.stats()
        return stats

    def _add_times(self, stats: dict[str, float]) -> None:
        """The cost model's times (they change every step)."""
        if self.chooser is not None:
            num_decodes = max(len(self._tracked), 1)
            plain = self.chooser.plain_step_seconds(num_decodes) or 0.0
            stats["cost_plain_step_us"] = 1e6 * plain
            for method, name in self._propose_time_names.items():
                per_request = self.chooser.proposer_time.per_request(method, self._step)
                stats[name] = 1e6 * per_request


def _observes(proposer: Proposer) -> bool:
    """Whether the proposer's `observe` does something (not BaseProposer's no-op)."""
    return getattr(type(proposer), "observe", None) is not BaseProposer.observe


def _works_in_background(proposer: Proposer) -> bool:
    return getattr(type(proposer), "background_work", None) is not BaseProposer.background_work


def _decode_only(items: Sequence[ScheduledRequest]) -> bool:
    """A step of decodes only (each fed its pending token and drafts): what step times and
    tokens per step are comparable across."""
    return bool(items) and all(
        item.do_sample and item.num_new_tokens == 1 + item.num_draft_tokens for item in items
    )


def _num_decodes(scheduler: Scheduler) -> int:
    """The running requests at the end of their known tokens: the next step's decodes."""
    return sum(len(r.all_token_ids) - r.num_computed_tokens == 1 for r in scheduler.running)


def _with_limit(spec: SpecRequest, max_draft_tokens: int) -> SpecRequest:
    """`spec` with another draft limit (dataclasses.replace costs several times more)."""
    return SpecRequest(
        spec.request_id, spec.token_ids, spec.num_prompt_tokens, max_draft_tokens, spec.row
    )


def _truncated(draft: Draft, count: int) -> Draft:
    """At most `count` drafts on any path from the pending token: a chain's first `count`, a
    tree's nodes down to depth `count` (breadth first, its first nodes)."""
    if draft.parents is not None:
        count = sum(depth <= count for depth in node_depths(draft.parents))
    if len(draft.token_ids) <= count:
        return draft
    probs = draft.probs[:count] if draft.probs is not None else None
    parents = draft.parents[:count] if draft.parents is not None else None
    return Draft(draft.token_ids[:count], probs, parents)
