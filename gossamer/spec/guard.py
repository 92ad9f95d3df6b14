"""The measured guard: speculation stays on only where measured wall-clock throughput says it pays.

The cost model (gossamer/spec/cost.py) predicts from the timed verification steps and the
proposers' host time, but not from everything a step costs: the engine's own per-step host work
(scheduling, inputs, update, outputs, the speculator's bookkeeping) grows with the tokens a step
emits and verifies, and on a small model it is a large share of a step. On the H200 a
gpt-oss-mini step at batch 8 is ~0.5 ms of GPU time but ~0.9 ms of wall time; there `auto`
accepted 2.08 tokens per draft (1.30 per request and step: 2048 tokens in 197 steps against
256), but a step took 1.58 ms against 0.91: 0.75x of plain decoding (batch 1: 1.38x).

So the speculator also measures. Per batch-size bucket (powers of two: 1, 2, 3-4, 5-8, ...) the
guard keeps, for the steps it let speculate and for those it kept plain, exponential averages of
a step's wall time and of the tokens it emitted per request. It runs a bucket in windows of
samples (decode-only steps, the first of each window left out: a switch costs once, e.g. a draft
model catches up on the tokens it skipped): the mode it currently prefers for `explore_every`
samples, then the other mode for `explore_steps`, whose average restarts so that it describes the
window alone; then it keeps the mode with the more tokens per request and second, switching only
when the other mode wins by more than `margin` (hysteresis: two modes about equal never flap). A new
bucket starts with a short window of speculation (the cost model's choice), then one of plain
decoding, then decides.

Tokens are compared per request so that two windows of one bucket at different batch sizes
(5 and 8 requests, say) compare fairly where the step time hardly depends on the batch (small
batches: launch and memory bound), which is where speculation matters.

The guard only decides whether a step may speculate; what is drafted and how it is verified do
not change, so greedy outputs stay those of plain decoding.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

STALL_FACTOR = 4.0  # a sample slower than this many times its mode's average is capped there
# Steps at the start of each window left unmeasured: the switch itself costs there (a draft model
# catches up on the tokens of a plain window in its first proposal).
WARMUP_STEPS = 1
# What `MeasuredGuard.record` made of a step (the speculator's cycle observer reports it).
SAMPLED = "sampled"
CAPPED = "sampled, capped"  # a stall: counted as STALL_FACTOR times its mode's average
WARM_UP = "window warm-up"  # a window's first steps, not measured
OTHER_WINDOW = "other mode's rate"  # averaged into its mode's rate, but not the window's step


def bucket_of(batch: int) -> int:
    """The bucket of a step of `batch` decodes: the power of two at or above it."""
    return 1 << max(batch - 1, 0).bit_length()


@dataclass
class ModeRate:
    """Exponential averages over the steps of one mode (speculating or plain) in one bucket."""

    seconds: float = 0.0  # wall time of a step
    tokens: float = 0.0  # tokens a step emitted
    tokens_per_request: float = 0.0
    num_samples: int = 0

    def record(self, seconds: float, tokens: int, requests: int, alpha: float) -> bool:
        """Returns whether the sample was capped as a stall."""
        capped = False
        if self.num_samples and seconds > STALL_FACTOR * self.seconds:
            # NOTE: a stall (a garbage collection, a compile, a pause of the caller) would
            # otherwise condemn whichever mode it happened to hit
            seconds, capped = STALL_FACTOR * self.seconds, True
        weight = alpha if self.num_samples else 1.0
        self.seconds += weight * (seconds - self.seconds)
        self.tokens += weight * (tokens - self.tokens)
        self.tokens_per_request += weight * (tokens / requests - self.tokens_per_request)
        self.num_samples += 1
        return capped

    @property
    def rate(self) -> float:
        """Tokens per request and second: what the guard compares."""
        return self.tokens_per_request / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Bucket:
    """One bucket's schedule: `mode` runs until `left` more samples of it arrived."""

    left: int
    unmeasured: int = WARMUP_STEPS  # first steps of the window not measured
    restart: bool = False  # the window's first measured step restarts its mode's average
    choice: bool = True  # the mode measurements favour (True: speculate)
    mode: bool = True  # the mode of the current window
    rates: dict[bool, ModeRate] = field(
        default_factory=lambda: {True: ModeRate(), False: ModeRate()}
    )
    num_switches: int = 0  # times the decision changed

    @property
    def exploring(self) -> bool:
        return self.mode != self.choice


class MeasuredGuard:
    """Whether a step of a given batch may speculate, from measured throughput (module doc)."""

    def __init__(self, explore_every: int, explore_steps: int, margin: float) -> None:
        self.explore_every = explore_every
        self.explore_steps = explore_steps
        self.margin = margin
        # the averages span about one exploration window
        self.alpha = 2 / (explore_steps + 1)
        self.buckets: dict[int, Bucket] = {}

    def allows(self, batch: int) -> bool:
        """Whether the next step, of `batch` decodes, may speculate."""
        return self._bucket(batch).mode

    def record(self, batch: int, speculated: bool, seconds: float, tokens: int) -> str:
        """A decode-only step of `batch` requests, run in mode `speculated`, took `seconds` of
        wall time and emitted `tokens`. Returns what became of it (SAMPLED, CAPPED, WARM_UP or
        OTHER_WINDOW)."""
        bucket = self._bucket(batch)
        if speculated == bucket.mode and bucket.unmeasured:
            bucket.unmeasured -= 1
            return WARM_UP
        if speculated == bucket.mode and bucket.restart:
            # an exploration window measures the present alone (the stats show the last
            # measurement until then)
            bucket.rates[speculated], bucket.restart = ModeRate(), False
        capped = bucket.rates[speculated].record(seconds, tokens, batch, self.alpha)
        if speculated != bucket.mode:
            return OTHER_WINDOW  # decided for another bucket (the batch changed)
        bucket.left -= 1
        if bucket.left <= 0:
            self._next_window(bucket)
        return CAPPED if capped else SAMPLED

    def _bucket(self, batch: int) -> Bucket:
        key = bucket_of(batch)
        if key not in self.buckets:  # a short first window of the cost model's choice
            self.buckets[key] = Bucket(left=self.explore_steps)
        return self.buckets[key]

    def _next_window(self, bucket: Bucket) -> None:
        bucket.unmeasured = WARMUP_STEPS
        if bucket.exploring:
            self._decide(bucket)
            bucket.mode, bucket.left = bucket.choice, self.explore_every
        else:
            bucket.mode, bucket.left = not bucket.choice, self.explore_steps
            bucket.restart = True

    def _decide(self, bucket: Bucket) -> None:
        kept, explored = bucket.rates[bucket.choice], bucket.rates[bucket.mode]
        if explored.num_samples and explored.rate > kept.rate * (1 + self.margin):
            bucket.choice = bucket.mode
            bucket.num_switches += 1

    def stats(self) -> dict[str, float]:
        """Per bucket b: guard_b{b}_spec_tokens_per_s and guard_b{b}_plain_tokens_per_s (the
        averages, 0 before a sample), guard_b{b}_speculating (the current choice, 1 or 0),
        guard_b{b}_switches."""
        # NOTE: the engine reads the stats after every step: the names are made once per bucket
        stats: dict[str, float] = {}
        for key, bucket in sorted(self.buckets.items()):
            spec, plain, speculating, switches = _stat_names(key)
            stats[spec] = bucket.rates[True].tokens_per_s
            stats[plain] = bucket.rates[False].tokens_per_s
            stats[speculating] = float(bucket.choice)
            stats[switches] = bucket.num_switches
        return stats


@functools.cache
def _stat_names(bucket: int) -> tuple[str, str, str, str]:
    prefix = f"guard_b{bucket}_"
    return tuple(
        prefix + name
        for name in ("spec_tokens_per_s", "plain_tokens_per_s", "speculating", "switches")
    )
