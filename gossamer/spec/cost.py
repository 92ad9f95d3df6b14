"""Cost-aware draft lengths: how many drafts k (0 = none) the next step should verify.

A step that verifies k drafts per sequence costs cost(batch, k) plain decode steps of that batch
(`StepCost`: a measured table, extrapolated past its largest batch toward 1 + k, the compute-bound
cost). A request whose draft positions are accepted with conditional rates a_0, a_1, ... (a_i:
position i is accepted once positions < i were) emits on average E(k) = 1 + g_0 + ... + g_{k-1}
tokens, where g_i = a_0 * ... * a_i. The rule maximises the batch's expected tokens per unit of
step cost, sum E / cost, against k = 0 (B tokens for cost 1), so a batch stops speculating when no
k emits more than one token per plain step's worth of cost; as the batch grows a draft costs more
and the acceptance that pays rises (gpt-oss-120b table: 0.24 per position at batch 1, 0.71 at 8,
0.90 at 32):

- padded steps (every decode verifies the same k, filler where drafts are short): try each k of
  the draft-length ladder; a request contributes its gains up to min(k, its draft length);
- ragged steps (each request its own k_r): cost(batch, mean k_r), and for a given total of draft
  tokens T the best allocation is the T largest gains overall (each request's gains fall with
  the position, so the largest T always form prefixes); try every T.

Host time: proposing runs on the host between steps (python suffix and n-gram lookups per request,
a draft model's forward passes), and the GPU waits for it. With a small model it is a large share
of a step (gpt-oss-mini: ~40 us per request for suffix, a 0.66 ms step at batch 8), so a step that
proposes for requests R is charged H = sum over r in R of p_r / T extra plain steps, where p_r is
the running estimate of its method's seconds per request (`ProposerTime`) and T the plain step's
seconds. The rule then compares

    (B + sum of gains) / (cost(B, k) + H)   against   B / 1,

so a step speculates only when its expected extra tokens pay for the verification and for the
proposing. H counts only before proposing (once the drafts exist their time is spent): padded,
every request with a draft proposes; ragged, the requests given at least one draft. T is the
engine's measured step time (wall time between the speculator's calls, over cost(B, k) of the
step), or before that the calibrated k = 0 step (gossamer/spec/calibrate.py); without either,
no host charge. The estimates fade toward 0 while a method is not proposing, so that a proposer
left off for its cost is timed again now and then.

The step costs: an explicit `cost_table` of the config; else, on the GPU with CUDA graphs, the
table the engine times at start-up on its own runner (gossamer/spec/calibrate.py); else
DEFAULT_COST_TABLE.

The acceptance rates come from `AcceptanceStats`: per request and method, counts of tries and
acceptances per position that fade with every engine step, shrunk toward the method's rates over
all requests, which are themselves shrunk toward the previous position's rate (position 0 toward
`PRIOR_ACCEPTANCE`). Fading is the exploration: evidence against speculating wears off, the
estimate drifts back to the prior, and a step tries again (the speculator's per-request off
switch still backs off requests whose drafts keep failing).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Sequence

# Measured on one H200, gpt-oss-120b, context 1024, CUDA graph replay (BENCHMARKS.md, session 3
# call 5: 2.662 ms at k = 0), relative to k = 0: {batch: {k: cost}}. Larger batches extrapolate
# (StepCost); the session-2 batch-8 measurement (1.61, 2.20, 2.83 for k = 1..3) is within 10% of
# what that gives (1.71, 2.42, 3.13).
DEFAULT_COST_TABLE: tuple[tuple[int, tuple[tuple[int, float], ...]], ...] = (
    (
        1,
        (
            (0, 1.0),
            (1, 1.24),
            (2, 1.50),
            (3, 1.69),
            (4, 2.05),
            (5, 2.23),
            (6, 2.46),
            (7, 2.64),
        ),
    ),
)
# Acceptance assumed before anything was verified, and how many observations it weighs. Mildly
# optimistic (ngram and EAGLE-3 see about 0.6 to 0.75 on real text), so that small batches try
# speculation and learn the real rate; large batches then decide on that evidence.
PRIOR_ACCEPTANCE = 0.7
PRIOR_WEIGHT = 2.0
# The acceptance per position that `DraftLengthChooser.can_pay` assumes before any draft was
# verified: above the prior, so that no batch is written off before speculation was tried there.
GENEROUS_ACCEPTANCE = 0.8
# The method-wide statistics fade over about this many acceptance windows of steps, so that a
# method judged useless is tried again now and then (per request they fade over one window).
METHOD_MEMORY_WINDOWS = 16

# StepCost remembers at most this many (batch, k) costs (ragged steps ask fractional k).
MAX_MEMO_ENTRIES = 4096

CostFunction = Callable[[int, float], float]


class StepCost:
    """cost(batch, k): a step where `batch` sequences verify k drafts each, in plain decode steps
    of that batch. Linear in k between measured points and beyond the last one; linear in the
    batch between measured rows; below the first row, the first row.

    Above the last row it extrapolates: a step's time is about affine in the tokens it feeds,
    t0 + t1 * tokens (weights and launches, then the per-token work; the measured gpt-oss-120b
    batch-1 costs are within 0.05 of a line). Then one more draft per sequence costs
    B t1 / (t0 + B t1) = B / (B + h) plain steps, h = t0 / t1: about its own weight's share at
    batch 1 and ever closer to a whole step as the batch grows (compute bound, k drafts cost k
    steps). The last row's own shape in k is kept and scaled by how that share grew since its
    batch, never above 1 + k nor below the row itself."""

    def __init__(self, table: Sequence[tuple[int, Sequence[tuple[float, float]]]]) -> None:
        rows = sorted((batch, sorted(points)) for batch, points in table)
        self.batches = [float(batch) for batch, _ in rows]
        # each row relative to its own k = 0 time
        self.rows = [[(k, cost / points[0][1]) for k, cost in points] for _, points in rows]
        self.draft_share = _draft_share(self.rows[-1])  # what a draft costs at the last batch
        self.half_batch = _half_batch(self.batches[-1], self.draft_share)
        # (batch, k) -> cost: the chooser asks the same few every step (a table never changes)
        self._memo: dict[tuple[int, float], float] = {}

    def __call__(self, batch: int, k: float) -> float:
        if k <= 0:
            return 1.0
        key = (batch, k)
        cost = self._memo.get(key)
        if cost is None:
            if len(self._memo) >= MAX_MEMO_ENTRIES:
                self._memo.clear()
            cost = self._memo[key] = self._cost(batch, k)
        return cost

    def _cost(self, batch: int, k: float) -> float:
        if batch > self.batches[-1]:
            return self._extrapolated(batch, k)
        costs = [_cost_at(row, k) for row in self.rows]
        if batch <= self.batches[0]:
            return costs[0]
        return _interpolate(list(zip(self.batches, costs, strict=True)), batch)

    def _extrapolated(self, batch: int, k: float) -> float:
        measured = _cost_at(self.rows[-1], k)
        if self.half_batch is None:
            return measured  # drafts measured free (or cheaper than nothing): no growth
        growth = (batch / (batch + self.half_batch)) / self.draft_share
        return max(measured, min(1 + k, 1 + (measured - 1) * growth))


def _draft_share(row: Sequence[tuple[float, float]]) -> float:
    """The cost of one draft per sequence in plain steps: the least-squares slope through
    (0, 1) of the row's measured costs."""
    drafts = [(k, cost - 1) for k, cost in row if k > 0]
    return sum(k * extra for k, extra in drafts) / sum(k * k for k, _ in drafts)


def _half_batch(batch: float, draft_share: float) -> float | None:
    """h of the affine model, from a draft's share at `batch`: batch / (batch + h) = share.
    None when drafts cost nothing there; 0 when a draft already costs a whole step."""
    if draft_share <= 0:
        return None
    return batch * max(1 - draft_share, 0.0) / draft_share


def _cost_at(row: Sequence[tuple[float, float]], k: float) -> float:
    """Linear between measured k; past the last, the last segment's slope, never falling."""
    (k0, cost0), (k1, cost1) = row[-2], row[-1]
    if k <= k1:
        return _interpolate(row, k)
    return cost1 + max(cost1 - cost0, 0.0) * (k - k1) / (k1 - k0)


def _interpolate(points: Sequence[tuple[float, float]], x: float) -> float:
    """Piecewise linear through sorted points (at least two), extended by the end segments."""
    index = next((i for i in range(1, len(points) - 1) if x < points[i][0]), len(points) - 1)
    (x0, y0), (x1, y1) = points[index - 1], points[index]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


class AcceptanceStats:
    """Per draft position: how often it was verified after every earlier position was accepted
    (`tried`), and how often it was accepted then (`accepted`). With decay < 1 the counts fade by
    that factor per engine step, so old evidence, and a request that stopped speculating, drift
    back to the prior."""

    __slots__ = ("tried", "accepted", "decay", "last_step")

    def __init__(self, num_positions: int, decay: float = 1.0) -> None:
        self.tried = [0.0] * num_positions
        self.accepted = [0.0] * num_positions
        self.decay = decay
        self.last_step = 0

    def record(self, num_drafted: int, num_accepted: int, step: int = 0) -> None:
        """A verified draft: positions < num_accepted accepted, position num_accepted rejected
        (when there was one); later positions were never put to the test."""
        scale = self._fade(step)
        self.last_step = step
        for i in range(len(self.tried)):
            self.tried[i] *= scale
            self.accepted[i] *= scale
        for i in range(min(num_accepted + 1, num_drafted, len(self.tried))):
            self.tried[i] += 1
            self.accepted[i] += i < num_accepted

    def rates(self, prior: Sequence[float], step: int = 0) -> list[float]:
        """Conditional acceptance per position, each shrunk toward prior[i]."""
        scale = self._fade(step)
        return [
            (scale * accepted + PRIOR_WEIGHT * p) / (scale * tried + PRIOR_WEIGHT)
            for tried, accepted, p in zip(self.tried, self.accepted, prior, strict=True)
        ]

    def chained_rates(self, step: int = 0) -> list[float]:
        """Conditional acceptance per position, each shrunk toward the previous position's
        estimate (the first toward PRIOR_ACCEPTANCE): untried positions inherit, which lets k
        grow once the positions below it are accepted often."""
        scale = self._fade(step)
        rates, previous = [], PRIOR_ACCEPTANCE
        for tried, accepted in zip(self.tried, self.accepted, strict=True):
            previous = (scale * accepted + PRIOR_WEIGHT * previous) / (scale * tried + PRIOR_WEIGHT)
            rates.append(previous)
        return rates

    def _fade(self, step: int) -> float:
        return self.decay ** max(step - self.last_step, 0)


def gains(rates: Sequence[float], length: int) -> list[float]:
    """g_i = P(positions 0..i all accepted) for i < length: what draft i adds to E(k)."""
    return list(itertools.accumulate(rates[:length], operator.mul))


def choose_draft_lens(
    request_gains: Sequence[Sequence[float]],  # one per decode of the step ([] for no draft)
    cost: CostFunction,
    ladder: Sequence[int],
    padded: bool,
    token_budget: int | None = None,
    host_costs: Sequence[float] | None = None,  # per request: proposing it, in plain steps
) -> list[int]:
    """Drafts per request (0 = none) that maximise expected tokens per unit of step cost, the
    host time of proposing for the requests that get drafts included."""
    host = host_costs if host_costs is not None else [0.0] * len(request_gains)
    if padded:
        return _padded_lens(request_gains, cost, ladder, token_budget, host)
    return _ragged_lens(request_gains, cost, token_budget, host)


def _padded_lens(request_gains, cost, ladder, token_budget, host_costs) -> list[int]:
    batch = len(request_gains)
    # every request with a draft proposes whatever k the step takes
    host = sum(h for g, h in zip(request_gains, host_costs, strict=True) if g)
    # prefix[r][j] = sum(request_gains[r][:j]), summed in the same order as sum() would
    prefix = [(0.0, *itertools.accumulate(g)) for g in request_gains]
    best_k, best_value = 0, float(batch)
    for k in ladder:
        if token_budget is not None and batch * (1 + k) > token_budget:
            break
        tokens = batch + sum(p[min(k, len(p) - 1)] for p in prefix)
        value = tokens / (cost(batch, k) + host)
        if value > best_value:
            best_k, best_value = k, value
    return [min(best_k, len(g)) for g in request_gains]


def _ragged_lens(request_gains, cost, token_budget, host_costs) -> list[int]:
    batch = len(request_gains)
    ranked = sorted(
        (
            (g, position, request)
            for request, gs in enumerate(request_gains)
            for position, g in enumerate(gs)
        ),
        key=lambda entry: (-entry[0], entry[1], entry[2]),
    )
    if token_budget is not None:
        del ranked[max(token_budget - batch, 0) :]
    best_count, best_value, tokens, host = 0, float(batch), float(batch), 0.0
    for count, (g, position, request) in enumerate(ranked, 1):
        tokens += g
        if position == 0:  # a request's first draft (gains fall with the position): it proposes
            host += host_costs[request]
        value = tokens / (cost(batch, count / batch) + host)
        if value > best_value:
            best_count, best_value = count, value
    lens = [0] * batch
    for _, _, request in ranked[:best_count]:
        lens[request] += 1
    return lens


class ProposerTime:
    """Host seconds per request of each method's `propose`: an exponential average (weight
    `alpha` per timed call) that fades by `decay` per engine step toward 0 while the method is
    not timed, so that a proposer judged too slow to pay is tried again now and then."""

    def __init__(self, alpha: float, decay: float) -> None:
        self.alpha = alpha
        self.decay = decay
        self._estimates: dict[str, tuple[float, int]] = {}  # method -> (seconds, step)

    def record(self, method: str, seconds: float, num_requests: int, step: int) -> None:
        sample = seconds / max(num_requests, 1)
        if method not in self._estimates:
            self._estimates[method] = (sample, step)
            return
        previous = self.per_request(method, step)
        self._estimates[method] = (previous + self.alpha * (sample - previous), step)

    def per_request(self, method: str, step: int) -> float:
        seconds, last_step = self._estimates.get(method, (0.0, step))
        return seconds * self.decay ** max(step - last_step, 0)


class StepTime:
    """The engine's plain decode step in seconds, from the wall time of recent decode-only steps
    over their modelled cost(batch, k): an exponential average (weight `alpha`) whose samples
    are capped at 4x the estimate, so that a stall (a compile, a pause of the caller) does not
    make host time look cheap."""

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self.seconds: float | None = None

    def record(self, seconds: float, cost: float) -> None:
        sample = seconds / cost
        if self.seconds is None:
            self.seconds = sample
        else:
            self.seconds += self.alpha * (min(sample, 4 * self.seconds) - self.seconds)


class DraftLengthChooser:
    """The speculator's cost-aware k: acceptance statistics per method (all requests) and per
    request and method, and `choose_draft_lens` over them."""

    def __init__(
        self,
        table: Sequence[tuple[int, Sequence[tuple[float, float]]]] | None,
        ladder: Sequence[int],
        num_positions: int,
        window: int,
    ) -> None:
        self.cost = StepCost(table or DEFAULT_COST_TABLE)
        self.ladder = tuple(ladder)
        self.num_positions = num_positions
        # exponential averages over `window` steps (per request) and 16 windows (per method)
        self.request_decay = 1 - 2 / (window + 1)
        self.method_decay = 1 - 2 / (METHOD_MEMORY_WINDOWS * window + 1)
        self._methods: dict[str, AcceptanceStats] = {}
        self._requests: dict[str, dict[str, AcceptanceStats]] = {}
        self.proposer_time = ProposerTime(1 - self.request_decay, self.method_decay)
        self.step_time = StepTime(1 - self.request_decay)
        self._calibrated_seconds: list[tuple[float, float]] = []  # (batch, k = 0 step seconds)
        # The rates of the current step: a step ranks, bounds and chooses with the same ones
        # several times per request. Valid while (step, records) is `_rates_key`; any record
        # (or forget) moves `_records` on.
        self._records = 0
        self._rates_key = (-1, -1)
        self._rates: dict[tuple[str | None, str], list[float]] = {}  # (request|None, method)
        self._gains: dict[tuple[str, str], list[float]] = {}  # (request, method): all positions
        self._expected: dict[tuple[str, str], float] = {}  # (request, method) -> accepted

    def use_measured_table(self, table: Sequence[tuple[int, Sequence[tuple[float, float]]]]):
        """Decide with a table timed on this engine (milliseconds; gossamer/spec/calibrate.py):
        its costs, and its k = 0 steps as the plain step's time until the engine measured it."""
        self.cost = StepCost(table)
        self._calibrated_seconds = [
            (float(batch), dict(points)[0] / 1e3) for batch, points in table
        ]

    def plain_step_seconds(self, batch: int) -> float | None:
        """What a plain decode step takes: the engine's measurement, else the calibration's k = 0
        step at `batch` (linear between its batches, the nearest end outside), else None."""
        if self.step_time.seconds is not None:
            return self.step_time.seconds
        points = self._calibrated_seconds
        if not points:
            return None
        if len(points) == 1 or batch <= points[0][0]:
            return points[0][1]
        return points[-1][1] if batch >= points[-1][0] else _interpolate(points, batch)

    def record_step_time(self, batch: int, num_drafts: int, seconds: float) -> None:
        """A decode-only step of `batch` requests and `num_drafts` drafts took `seconds`."""
        # (a plain step costs one plain step: no table lookup on the steps of an idle batch)
        cost = self.cost(batch, num_drafts / batch) if num_drafts else 1.0
        self.step_time.record(seconds, cost)

    def record_proposer_time(self, method: str, seconds: float, num_requests: int, step: int):
        self.proposer_time.record(method, seconds, num_requests, step)

    def record(self, request_id: str, method: str, drafted: int, accepted: int, step: int) -> None:
        self._records += 1
        self._method_stats(method).record(drafted, accepted, step)
        own = self._requests.setdefault(request_id, {})
        if method not in own:
            own[method] = AcceptanceStats(self.num_positions, self.request_decay)
        own[method].record(drafted, accepted, step)

    def forget(self, request_id: str) -> None:
        self._records += 1
        self._requests.pop(request_id, None)

    def rates(self, request_id: str, method: str, step: int) -> list[float]:
        """The request's conditional acceptance per position for drafts of `method` (a list the
        caller must not change: it is shared until the next record or step)."""
        cache = self._rates_of_step(step)
        rates = cache.get((request_id, method))
        if rates is None:
            prior = self._method_rates(method, step)
            own = self._requests.get(request_id, {}).get(method)
            rates = own.rates(prior, step) if own is not None else prior
            cache[(request_id, method)] = rates
        return rates

    def _method_rates(self, method: str, step: int) -> list[float]:
        """The method's chained rates over all requests (the prior of each request's own)."""
        cache = self._rates_of_step(step)
        rates = cache.get((None, method))
        if rates is None:
            rates = cache[(None, method)] = self._method_stats(method).chained_rates(step)
        return rates

    def _rates_of_step(self, step: int) -> dict[tuple[str | None, str], list[float]]:
        """The rates cache, emptied when the step or the records changed since it was filled."""
        key = (step, self._records)
        if key != self._rates_key:
            self._rates_key = key
            self._rates.clear()
            self._gains.clear()
            self._expected.clear()
        return self._rates

    def _all_gains(self, request_id: str, method: str, step: int) -> list[float]:
        """gains(rates, num_positions) of the request and method; gains(rates, k) is its first
        k (a running product), so one list serves every draft length."""
        rates = self.rates(request_id, method, step)  # first: it may empty the caches
        key = (request_id, method)
        all_gains = self._gains.get(key)
        if all_gains is None:
            all_gains = self._gains[key] = gains(rates, self.num_positions)
        return all_gains

    def expected_accepted(self, request_id: str, method: str, step: int) -> float:
        """Accepted drafts the request can expect from `method` with every position drafted:
        what "auto" ranks the methods of a request by."""
        all_gains = self._all_gains(request_id, method, step)  # first: it may empty the caches
        expected = self._expected.get((request_id, method))
        if expected is None:
            expected = self._expected[(request_id, method)] = sum(all_gains)
        return expected

    def best_rates(self, step: int) -> list[float]:
        """Per position, the best conditional acceptance of any method over all its requests
        (GENEROUS_ACCEPTANCE at every position before any draft was verified)."""
        observed = [method for method, stats in self._methods.items() if any(stats.tried)]
        if not observed:
            return [GENEROUS_ACCEPTANCE] * self.num_positions
        per_method = [self._method_rates(method, step) for method in observed]
        return [max(rates) for rates in zip(*per_method, strict=True)]

    def can_pay(
        self,
        num_decodes: int,
        padded: bool,
        token_budget: int | None,
        step: int,
        host_seconds: float = 0.0,  # proposing, per request
    ) -> bool:
        """Whether some k > 0 could pay in a step of `num_decodes` decodes if every one of them
        were accepted at `best_rates` and proposed for in `host_seconds`. False: `choose` would
        give no drafts at this batch to requests whose own rates are at most those and whose
        method proposes in at least `host_seconds` (Speculator.idle_for)."""
        request_gains = [gains(self.best_rates(step), self.num_positions)] * num_decodes
        plain = self.plain_step_seconds(num_decodes)
        host = [host_seconds / plain] * num_decodes if host_seconds and plain else None
        lens = choose_draft_lens(request_gains, self.cost, self.ladder, padded, token_budget, host)
        return any(lens)

    def _method_stats(self, method: str) -> AcceptanceStats:
        if method not in self._methods:
            self._methods[method] = AcceptanceStats(self.num_positions, self.method_decay)
        return self._methods[method]

    def choose(
        self,
        wanted: Sequence[tuple[str, str, int]],  # (request id, method, most drafts it may get)
        num_decodes: int,  # decodes in the step, those in `wanted` included
        padded: bool,
        token_budget: int,
        step: int,
        charge_host: bool = False,
    ) -> list[int]:
        """Drafts per entry of `wanted` (0 = none). `charge_host`: the proposers' host time is
        still to be spent (before proposing), so it counts against speculating."""
        request_gains = [
            self._all_gains(request_id, method, step)[:length]
            for request_id, method, length in wanted
        ]
        request_gains += [[]] * (num_decodes - len(wanted))
        host = self._host_costs(wanted, num_decodes, step) if charge_host else None
        lens = choose_draft_lens(request_gains, self.cost, self.ladder, padded, token_budget, host)
        return lens[: len(wanted)]

    def _host_costs(
        self, wanted: Sequence[tuple[str, str, int]], num_decodes: int, step: int
    ) -> list[float] | None:
        """Per decode: its method's proposing time in plain steps (None: no step time known)."""
        plain = self.plain_step_seconds(num_decodes)
        if not plain:
            return None
        costs = [self.proposer_time.per_request(method, step) / plain for _, method, _ in wanted]
        return costs + [0.0] * (num_decodes - len(wanted))
