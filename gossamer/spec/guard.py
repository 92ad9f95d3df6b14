"""The measured guard: speculation stays on only where the wall clock says it pays.

The cost model (gossamer/spec/cost.py) predicts from the timed verification steps and the
proposers' host time, but not from everything a step costs: the engine's own per-step host work
(scheduling, inputs, update, outputs, the speculator's bookkeeping) grows with the tokens a step
emits and verifies, and on a small model it is a large share of a step. On the H200 a
gpt-oss-mini step at batch 8 is ~0.5 ms of GPU time but ~0.9 ms of wall time; there `auto`
accepted 2.08 tokens per draft (1.30 per request and step: 2048 tokens in 197 steps against
256), but a step took 1.58 ms against 0.91: 0.75x of plain decoding (batch 1: 1.38x).

So the speculator also measures. Per batch-size bucket (powers of two: 1, 2, 3-4, 5-8, ...) the
guard runs windows of decode-only steps: the mode it currently keeps for `explore_every` steps (or
more, below), then the other mode for `explore_steps`; then it keeps the faster, switching only
when the other mode wins by more than `margin` (hysteresis: two modes about equal never flap). A
new bucket starts with a short window of speculation (the cost model's choice), then one of plain
decoding, then decides. While a bucket is plain it does not speculate at all (the engine then overlaps its
plain steps). A step's time runs from one Speculator.after_step to the next, so the proposing for
it and every host cost of the step is in it.

What a window measures (benchmarks/guard_accounting.py sets it beside the run's wall clock; its
numbers below are from a CPU oracle model on a simulated H200, batch 8 unless said):

- **Everything a mode costs.** A window adds up the wall time of all its steps, not an average of
  the recent ones: a long window of the kept mode counts all of its steps. Only the switches
  themselves stay out (the first step of a window: a plain window's first step launches two steps,
  a draft model catches up on the tokens of a plain window), and stalls count at most STALL_FACTOR
  times the mode's recent step (a garbage collection or a pause of the caller in a window of eight
  0.5 ms steps would otherwise decide it).
- **Index builds, amortized.** A request's first proposal of a method builds its index (ngram and
  suffix index the whole prompt: ~1 ms per 1k-token request on a CPU core, tens of ms on the H200
  host). That is paid once per request, whatever the window it lands in, so a window is charged
  the share of it that falls on its own steps, not all of it. A building step counts as the
  window's typical step (the mean of its other steps; else the mode's recent step); its extra time
  E is split among the requests it indexed, and each request's part is spread over its expected
  decode steps L = (tokens it may still get, max_tokens less those it has) / (tokens per request
  and step the window measured), at least 1 and at most AMORTIZE_HORIZON times `explore_every`
  (the longest the guard keeps a decision; also where max_tokens is unknown). The window pays E/L
  for each of its steps from the build on, the whole of E where the request ends within it; every
  request of the window waits for that share in proportion to the time it ran. Counted in full
  (the guard of e6bd9e9), one 1k-token prompt's build made the first window of speculation at batch
  1 on the H200 look 11x slower than plain decoding (6.37 ms a token against 0.58), and the guard
  never speculated in a 256-token run that unguarded auto ran 1.20x faster; left out (the guard
  before it), a stream of new requests made speculation look cheaper than it is (3-14% of the run
  at batch 8). Amortized, a stream of arrivals still pays each request's build over its life.
- **What a request waits per token.** A window keeps, per request, the time it ran and the tokens
  it got, and is scored by the root mean square over requests (weighted by the time each ran) of
  seconds per token: the lower the better. Plain decoding gives every request one token per step;
  speculation gives requests whose drafts are accepted several and the others about one, in a
  step that takes longer. Compared by tokens per second of the batch (the old guard), speculation
  wins where the accepted requests gain more than the others lose, but those others then finish
  late: in a batch that arrived together (benchmarks/spec_decode.py e2e) the rest of the run is a
  tail of small batches. On the H200 at batch 8, auto with the old guard ran 0.75x of plain
  although its speculating windows emitted 22.0k tok/s against 17.7k; the oracle with e2e's mix
  (rewrites, summaries, stories) and a 10x slower device ran 0.87x, a quarter of the run in a
  two-request tail (0.97x now). The square weighs a slowed request more than a mean would: in a
  model of that closed batch (mini's H200 step times, mixes of per-request acceptance) it kept
  plain where the mean lost up to 25% (seven fast requests hid a slow one), lost at most 6%
  itself, and still speculated where a few requests lose a little and the run gains.
- **Plain windows measure their tail.** A plain step costs the same early or late in a window (no
  index, no catch-up), so a long kept window of plain decoding leaves all but its last PLAIN_TAIL
  x `explore_steps` steps unmeasured, like a window's warm-up, and the speculator skips its
  per-request bookkeeping there (`skips`). At batch 8 on the H200 gpt-oss-mini's overlapped plain
  steps are host bound (0.34 ms of GPU time each), and the speculator's per-step host work made
  auto's plain steps 0.82x as fast as no speculator's (session 9, benchmarks/spec_decode.py e2e
  --interleave; its --profile shows where).
- **Rare exploration where a mode lost.** A window of the slower mode costs its steps plus the
  switches and, for speculation, the indexes of the requests that arrived meanwhile (25-36 ms of a
  160 ms run). So the interval to the next exploration doubles with each that confirms the choice
  (up to MAX_BACKOFF times `explore_every`; a switch resets it), and is at least what keeps
  exploring a mode that cost r times as much per token within EXPLORE_SHARE of the time, but never
  more than MAX_BACKOFF times `explore_every` whatever r: one bad window cannot turn a mode off for
  good (with the defaults, 1024 steps). An exploration that confirmed the kept mode is also
  charged in wall time: what its steps took, index builds in full, beyond what the kept mode takes
  for the same tokens, and the next one waits until that is EXPLORE_SHARE of the time
  (`_steps_to_repay`; its requests never speculate again, so their builds were all paid), up to
  REPAY_MAX_BACKOFF times `explore_every` (4096 steps: ~1.2 s of mini's batch-8 steps, ~9 s of
  120b's).

Requests are compared by their own tokens so that two windows of one bucket at different batch
sizes (5 and 8 requests, say) compare fairly where the step time hardly depends on the batch
(small batches: launch and memory bound), which is where speculation matters.

The guard only decides whether a step may speculate; what is drafted and how it is verified do
not change, so greedy outputs stay those of plain decoding.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

STALL_FACTOR = 4.0  # a step slower than this many times its mode's recent steps is capped there
# Steps at the start of each window left unmeasured: the switch itself costs there (a draft model
# catches up on the tokens of a plain window in its first proposal).
WARMUP_STEPS = 1
# A decision compares each mode's windows merged, older ones weighed down by HISTORY_WEIGHT per
# window since: an 8-step window of speculation at batch 8 swings with the requests that happen
# to accept then (session 11 on the H200: one read 0.215 ms a token where all of the run's
# speculating steps averaged 0.382, and the guard kept speculating at 0.88x of plain).
HISTORY_WEIGHT = 0.5
MAX_BACKOFF = 8  # explorations that keep confirming the choice come at most 8x more rarely
# A kept window of plain decoding measures only its last PLAIN_TAIL windows' worth of steps
# (PLAIN_TAIL * explore_steps): module doc, "Plain windows measure their tail".
PLAIN_TAIL = 4
# An index build is spread over at most this many times `explore_every` of its request's steps:
# the longest the guard keeps a decision (module doc), and the life of a request of unknown length.
AMORTIZE_HORIZON = MAX_BACKOFF
# At most about this share of a bucket's time goes to exploring a mode that lost: a window of
# `explore_steps` steps that cost r times the kept mode's comes every explore_steps * (r - 1) /
# EXPLORE_SHARE steps at the earliest, but always within explore_every * MAX_BACKOFF.
EXPLORE_SHARE = 0.02
# ... except that an exploration's cost in wall time (`_steps_to_repay`: index builds, the shared
# trie's backlog) may push the next one out to REPAY_MAX_BACKOFF times `explore_every`. On the H200
# an exploration at batch 8 on gpt-oss-mini cost 17-27 ms (~80 plain steps of 0.3 ms; session 12,
# guard_accounting.py with interleaved rounds): within 1024 steps that was ~8% of the time.
REPAY_MAX_BACKOFF = 32
# What `MeasuredGuard.record` made of a step (the speculator's cycle observer reports it).
SAMPLED = "sampled"
INDEXED = "sampled, built an index"  # its extra time amortized over its requests' lives
CAPPED = "sampled, capped"  # a stall: counted as STALL_FACTOR times its mode's recent steps
# a window's first steps, not measured (of a long plain window: all but its tail)
WARM_UP = "window warm-up"
OTHER_WINDOW = "other mode's step"  # the batch changed bucket between deciding and recording


def bucket_of(batch: int) -> int:
    """The bucket of a step of `batch` decodes: the power of two at or above it."""
    return 1 << max(batch - 1, 0).bit_length()


@dataclass(frozen=True)
class IndexBuild:
    """A step whose proposing built some requests' indexes, held apart until its window ends."""

    position: int  # the window's steps before it
    seconds: float
    request_ids: tuple[str, ...]  # the step's requests (they all waited for it)
    remaining: tuple[float, ...]  # per request it indexed: the tokens it may still get


@dataclass
class Window:
    """The measured steps of one window: their wall time and tokens in all, and per request the
    time it ran and the tokens it got. Steps that built indexes wait in `builds` until `settle`
    charges them (module doc)."""

    seconds: float = 0.0
    tokens: float = 0.0
    num_steps: int = 0
    request_steps: int = 0  # the steps each request ran, summed over requests
    requests: dict[str, list[float]] = field(default_factory=dict)  # id -> [seconds, tokens]
    builds: list[IndexBuild] = field(default_factory=list)
    # what the window's steps took, index builds in full (`seconds` amortizes them)
    spent: float = 0.0

    def add(self, seconds: float, tokens: Mapping[str, float]) -> None:
        self.seconds += seconds
        self.spent += seconds
        self.num_steps += 1
        self.request_steps += len(tokens)
        for request_id, count in tokens.items():
            self.tokens += count
            entry = self.requests.get(request_id)
            if entry is None:
                self.requests[request_id] = [seconds, count]
            else:
                entry[0] += seconds
                entry[1] += count

    def add_build(
        self, seconds: float, tokens: Mapping[str, float], remaining: Mapping[str, float]
    ) -> None:
        """A step that built the indexes of the requests in `remaining` (id -> the tokens each may
        still get): its tokens count now, its time when the window is settled."""
        build = IndexBuild(self.num_steps, seconds, tuple(tokens), tuple(remaining.values()))
        self.builds.append(build)
        self.add(0.0, tokens)
        self.spent += seconds

    def settle(self, reference: float, horizon: float) -> None:
        """Charges the held index builds: each step as the window's typical one (the mean of its
        other steps, else `reference`; with neither, in full), and of its extra time the share
        of each request's expected life (in steps, at most `horizon`) that the window covers."""
        builds, self.builds = self.builds, []
        if not builds:
            return
        ordinary = self.num_steps - len(builds)
        typical = self.seconds / ordinary if ordinary else reference
        per_step = self.tokens / self.request_steps if self.request_steps else 1.0
        charge = 0.0
        for build in builds:
            own = min(build.seconds, typical) if typical > 0 else build.seconds
            self._spend(own, build.request_ids)
            covered = self.num_steps - build.position
            share = (build.seconds - own) / len(build.remaining)
            for tokens_left in build.remaining:
                life = min(max(tokens_left / per_step, 1.0), horizon)
                charge += share * min(covered / life, 1.0)
        self._stretch(charge)

    def merged(self, older: Window | None, weight: float) -> Window:
        """This window's time and tokens, overall and per request, with `older`'s (a settled
        one) added in at `weight`: what a decision compares. Its step counts stay this window's
        own and `spent` is left out: those serve settling a window and `_steps_to_repay`, which read
        the window itself."""
        if older is None:
            return self
        out = Window(
            self.seconds + weight * older.seconds,
            self.tokens + weight * older.tokens,
            self.num_steps,
            self.request_steps,
            {rid: [weight * s, weight * t] for rid, (s, t) in older.requests.items()},
        )
        for request_id, (seconds, tokens) in self.requests.items():
            entry = out.requests.setdefault(request_id, [0.0, 0.0])
            entry[0] += seconds
            entry[1] += tokens
        return out

    def _spend(self, seconds: float, request_ids: tuple[str, ...]) -> None:
        """`seconds` more for the window and each of `request_ids` (no more steps or tokens)."""
        self.seconds += seconds
        for request_id in request_ids:
            self.requests[request_id][0] += seconds

    def _stretch(self, seconds: float) -> None:
        """`seconds` more for the window, each request waiting for its share by the time it ran."""
        if seconds <= 0 or self.seconds <= 0:
            return
        factor = 1 + seconds / self.seconds
        self.seconds += seconds
        for entry in self.requests.values():
            entry[0] *= factor

    @property
    def seconds_per_token(self) -> float:
        """What a request waited per token: the root mean square over the requests, each weighted
        by the time it ran (what the guard compares; inf before any token). Plain decoding gives
        every request the step time; the square weighs a request that speculation slows more
        than one it speeds up (module doc)."""
        weighted = total = 0.0
        for seconds, tokens in self.requests.values():
            if tokens > 0:
                weighted += seconds * (seconds / tokens) ** 2
                total += seconds
        return math.sqrt(weighted / total) if total > 0 else math.inf

    @property
    def tokens_per_s(self) -> float:
        """Of the whole batch (the stats)."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Bucket:
    """One bucket's schedule: `mode` runs until `left` more steps of it were measured."""

    left: int
    unmeasured: int = WARMUP_STEPS  # first steps of the window not measured
    choice: bool = True  # the mode measurements favour (True: speculate)
    mode: bool = True  # the mode of the current window
    window: Window = field(default_factory=Window)
    # the last complete window of each mode
    last: dict[bool, Window | None] = field(default_factory=lambda: {True: None, False: None})
    # each mode's windows merged, older ones weighed down (HISTORY_WEIGHT): what a decision compares
    seen: dict[bool, Window | None] = field(default_factory=lambda: {True: None, False: None})
    # an exponential average of each mode's step seconds: the stall cap's reference
    recent: dict[bool, float] = field(default_factory=lambda: {True: 0.0, False: 0.0})
    backoff: int = 1  # explore_every times this: the kept mode's windows at the least
    interval: int = 0  # the steps of the kept mode's windows (set when deciding)
    num_switches: int = 0  # times the decision changed

    @property
    def exploring(self) -> bool:
        return self.mode != self.choice


class MeasuredGuard:
    """Whether a step of a given batch may speculate, from measured wall time (module doc)."""

    def __init__(self, explore_every: int, explore_steps: int, margin: float) -> None:
        self.explore_every = explore_every
        self.explore_steps = explore_steps
        self.margin = margin
        # the stall cap's reference spans about one exploration window
        self.alpha = 2 / (explore_steps + 1)
        self.buckets: dict[int, Bucket] = {}
        # batch size -> its bucket, once looked up (buckets are never replaced): the speculator
        # asks for a batch's bucket a few times per step
        self._of_batch: dict[int, Bucket] = {}
        self._stats: dict[str, float] = {}  # refreshed when a window ends

    def allows(self, batch: int) -> bool:
        """Whether the next step, of `batch` decodes, may speculate."""
        return self._bucket(batch).mode

    def record(
        self,
        speculated: bool,
        seconds: float,
        tokens: Mapping[str, float],
        built: Mapping[str, float] | None = None,
    ) -> str:
        """A decode-only step, run in mode `speculated`, took `seconds` of wall time and gave
        each of its requests `tokens[request id]`; `built`: the requests whose index proposing
        for it built, each with the tokens it may still get (math.inf: unknown). Returns what
        became of it (SAMPLED, INDEXED, CAPPED, WARM_UP or OTHER_WINDOW)."""
        bucket = self._bucket(len(tokens))
        if speculated != bucket.mode:
            return OTHER_WINDOW
        if not built and self.skips(len(tokens), speculated):
            return WARM_UP
        bucket.unmeasured = 0  # a first step that built an index is counted, and ends the warm-up
        if built:  # what speculating costs a new request: charged when the window ends
            bucket.window.add_build(seconds, tokens, built)
            verdict = INDEXED
        else:
            seconds, verdict = self._capped(bucket, speculated, seconds)
            bucket.window.add(seconds, tokens)
        bucket.left -= 1
        if bucket.left <= 0:
            self._next_window(bucket)
        return verdict

    def skips(self, batch: int, speculated: bool) -> bool:
        """Whether a step of `batch` decodes run in mode `speculated` (and building no index) is
        one its window leaves unmeasured; if so it is counted as such, as `record` would count
        it, without the step's time and tokens (which the caller then need not gather)."""
        bucket = self._of_batch.get(batch) or self.buckets.get(bucket_of(batch))
        if bucket is None or speculated != bucket.mode or not bucket.unmeasured:
            return False
        bucket.unmeasured -= 1
        return True

    def _capped(self, bucket: Bucket, speculated: bool, seconds: float) -> tuple[float, str]:
        """The seconds a step counts for and its verdict; updates the stall cap's reference."""
        recent = bucket.recent[speculated]
        if recent and seconds > STALL_FACTOR * recent:
            # NOTE: a stall (a garbage collection, a compile, a pause of the caller) would
            # otherwise decide a short window
            return STALL_FACTOR * recent, CAPPED
        bucket.recent[speculated] = recent + self.alpha * (seconds - recent) if recent else seconds
        return seconds, SAMPLED

    def _bucket(self, batch: int) -> Bucket:
        bucket = self._of_batch.get(batch)
        if bucket is None:
            key = bucket_of(batch)
            bucket = self.buckets.get(key)
            if bucket is None:  # a short first window of the cost model's choice
                bucket = self.buckets[key] = Bucket(left=self.explore_steps)
                self._stats = {}
            self._of_batch[batch] = bucket
        return bucket

    def _next_window(self, bucket: Bucket) -> None:
        horizon = self.explore_every * AMORTIZE_HORIZON
        bucket.window.settle(bucket.recent[bucket.mode], horizon)
        bucket.seen[bucket.mode] = bucket.window.merged(bucket.seen[bucket.mode], HISTORY_WEIGHT)
        bucket.last[bucket.mode], bucket.window = bucket.window, Window()
        bucket.unmeasured = WARMUP_STEPS
        if bucket.exploring:
            self._decide(bucket)
            bucket.mode, bucket.left = bucket.choice, bucket.interval
            tail = PLAIN_TAIL * self.explore_steps
            if not bucket.choice and bucket.interval > tail:  # plain: only the tail is measured
                bucket.unmeasured += bucket.interval - tail
                bucket.left = tail
        else:
            bucket.mode, bucket.left = not bucket.choice, self.explore_steps
        self._stats = {}

    def _decide(self, bucket: Bucket) -> None:
        """Keep the faster mode; the next exploration comes later the more often and the more
        clearly the other mode lost."""
        kept, explored = bucket.seen[bucket.choice], bucket.seen[bucket.mode]
        kept_cost = kept.seconds_per_token if kept is not None else math.inf
        explored_cost = explored.seconds_per_token
        if explored_cost * (1 + self.margin) < kept_cost:
            bucket.choice = bucket.mode
            bucket.num_switches += 1
            bucket.backoff = 1
        else:  # confirmed: the losing mode is explored less often
            bucket.backoff = min(2 * bucket.backoff, MAX_BACKOFF)
        low, high = sorted((kept_cost, explored_cost))
        loss = high / low if low > 0 else math.inf  # the loser's cost per token, relative
        longest = self.explore_every * MAX_BACKOFF
        # the loss lengthens the interval, but never past the doubling's cap: whatever one window
        # measured, the losing mode is explored again within `longest` steps; what a confirming
        # exploration cost in wall time may lengthen it up to REPAY_MAX_BACKOFF times
        by_loss = min(self.explore_steps * (loss - 1) / EXPLORE_SHARE, longest)
        if bucket.choice != bucket.mode:  # confirmed: also what the exploration cost in time
            repay_cap = self.explore_every * REPAY_MAX_BACKOFF
            by_loss = max(by_loss, min(_steps_to_repay(bucket), repay_cap))
        bucket.interval = max(self.explore_every * bucket.backoff, math.ceil(by_loss))

    def stats(self) -> dict[str, float]:
        """Per bucket b, of each mode's merged windows (`Bucket.seen`; 0 before one):
        guard_b{b}_spec_tokens_per_s and guard_b{b}_plain_tokens_per_s (of the whole batch),
        guard_b{b}_spec_ms_per_token and guard_b{b}_plain_ms_per_token (what a request waited per
        token: what the guard compares); guard_b{b}_speculating (the current choice, 1 or 0) and
        guard_b{b}_switches."""
        # NOTE: the engine reads the stats after every step: they are made again only once a
        # window ended or a bucket began
        if not self._stats:
            for key, bucket in sorted(self.buckets.items()):
                self._stats |= _bucket_stats(key, bucket)
        return self._stats


def _steps_to_repay(bucket: Bucket) -> float:
    """Steps of the kept mode over which the exploration that just lost costs EXPLORE_SHARE of
    the time: what its steps took (index builds in full) beyond what the kept mode would have
    taken for the same tokens. The per-token loss alone amortizes a build over its request's
    life, but a request whose exploration confirmed plain decoding never speculates again, so
    the run paid all of it: in a stream of 256-token batches on mini at batch 8 each exploration
    built 8 new indexes and auto ran 0.84x of plain decoding while its guard kept plain (session
    11; the CPU oracle of benchmarks/guard_accounting.py: 0.91x, 0.96x with this)."""
    explored, kept = bucket.last[bucket.mode], bucket.seen[bucket.choice]
    step = bucket.recent[bucket.choice]
    if explored is None or kept is None or kept.tokens <= 0 or step <= 0:
        return 0.0
    extra = explored.spent - explored.tokens * kept.seconds / kept.tokens
    return max(extra, 0.0) / (EXPLORE_SHARE * step)


def _bucket_stats(key: int, bucket: Bucket) -> dict[str, float]:
    names = _stat_names(key)
    stats = {}
    for mode, rate_name, wait_name in ((True, *names[:2]), (False, *names[2:4])):
        window = bucket.seen[mode]
        stats[rate_name] = window.tokens_per_s if window is not None else 0.0
        wait = window.seconds_per_token if window is not None else math.inf
        stats[wait_name] = 1e3 * wait if wait < math.inf else 0.0
    stats[names[4]] = float(bucket.choice)
    stats[names[5]] = bucket.num_switches
    return stats


@functools.cache
def _stat_names(bucket: int) -> tuple[str, ...]:
    prefix = f"guard_b{bucket}_"
    return tuple(
        prefix + name
        for name in (
            "spec_tokens_per_s",
            "spec_ms_per_token",
            "plain_tokens_per_s",
            "plain_ms_per_token",
            "speculating",
            "switches",
        )
    )
