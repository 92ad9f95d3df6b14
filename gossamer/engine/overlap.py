"""Overlapped (asynchronous) scheduling of plain decode steps: EngineConfig.async_scheduling.

Why: an ordinary engine step ends with a host sync (the sampled tokens come to the host), then the
host updates the requests, detokenizes, builds outputs, schedules the next step, fills its inputs
and launches it; all that time (about 0.1-0.2 ms at batch 1, BENCHMARKS.md "Engine host
overhead") the GPU idles. vLLM (--async-scheduling) and SGLang (overlap scheduler) hide it by
launching step N + 1 before step N's tokens reach the host; so does this module.

How (EngineCore._step_overlapped drives it):

1. A step that `Scheduler.schedule()` returns is run as before, except when it is a plain decode
   step that nothing on the host needs to see first (`may_overlap`): every request decodes one
   token (no prefill chunk, no drafts, no preemption in this step) and samples without host-side
   state (no logprobs, no penalties, min_tokens already reached, no n > 1 choices waiting to
   fork). Such a step is launched (`InFlightStep`): the runner runs it, the tokens are sampled on
   the device (`sample_on_device`, the same draws as `Sampler.sample`) and their copy to the host
   is queued behind them (pinned memory, non-blocking, an event), and the host moves on.
2. `Scheduler.schedule_continuation(N)` schedules step N + 1 from the scheduler's state, assuming
   every running request continues: the same requests, positions + 1, KV slots from the block
   allocation (a new block when a position starts one). It declines whenever the ordinary
   schedule might decide otherwise: requests waiting (new arrivals), a block short (preemption),
   the end of the context, a running request that was not in step N.
3. Step N + 1 is launched with step N's sampled tokens as its input ids, copied device to device
   into the runner's input buffer (`ModelRunner.run(device_input_ids=...)`): no host round trip.
   Only then does the host wait for step N's tokens, and it applies them as an ordinary step does
   (Scheduler.update, stop tokens and strings, detokenizing, outputs) while the GPU runs N + 1.
4. The next `step()` call continues from N + 1 the same way, or, when the scheduler declines,
   applies N + 1's tokens and returns; the call after that schedules ordinarily. So prefills,
   arrivals, preemption, speculative decoding, logprobs and penalties all run the synchronous
   step, and the overlap resumes at the next plain decode step.
5. With a speculator, plain decode steps overlap only while it is idle at the running batch
   (Speculator.may_run_ahead: no request would get a draft there); the engine checks before each
   continuation. Applying a step while the next is in flight proposes nothing (those drafts would
   miss the in-flight token); once the speculator is no longer idle, the in-flight step is applied
   without launching another, and that synchronous apply proposes for the next step.

A request found finished when step N's tokens are applied (EOS, a stop token or string,
max_tokens, an abort between two `step()` calls) has computed one token too many in step N + 1:
Scheduler.update drops it, since the request is no longer running. Its KV slot was allocated
like any other, and the scheduler frees it with the request's other blocks when the request
ends, so the block pool's accounting is unchanged. Freeing while step N + 1 still writes that slot
is safe: blocks change hands on the host only, and whoever gets the block next writes it in a
later step, after N + 1 on the same CUDA stream. The next continuation gathers the device tokens
of the requests still running (`InFlightStep.tokens_for`).

Outputs are those of the synchronous engine, token for token, for greedy and seeded sampling
(each seeded request draws from its own generator, in the same order). Unseeded random sampling
draws from the engine's shared generator; a request's extra row draws from it too, so unseeded
outputs may differ from a synchronous run (they depend on the batch anyway).

What keeps the host from waiting for the GPU before step N + 1 is launched: the runner's inputs
are pinned host arrays uploaded with non-blocking copies (runner/host_copy.py), and so is
everything the device-side sampler builds on the host (row indices, temperatures and filters, the
CPU-drawn noise of random sampling). The runner's next fill waits for the previous step's uploads
to have run (`UploadFence`): in this loop those sit right behind step N - 1's tokens, which the host
has already waited for, so that wait is short. The host still waits once per step, on purpose:
for step N's tokens, after N + 1 is launched. Not overlapped, and still syncing as before: the
synchronous steps (prefill, speculative decoding, logprobs, penalties), whose tokens come back
through `.tolist()`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from gossamer.runner.host_copy import to_device
from gossamer.runner.sampler import Sampler, SamplingRow
from gossamer.sampling_params import SamplingParams
from gossamer.scheduler import SchedulerOutput


def needs_host_tokens(params: SamplingParams, num_output_tokens: int) -> bool:
    """Whether sampling a request's next token reads its earlier tokens on the host (so its
    previous token must be there first): logprobs, penalties, or min_tokens not yet reached."""
    return (
        params.logprobs is not None
        or params.uses_penalties
        or num_output_tokens < params.min_tokens
    )


def is_plain_decode(scheduled: SchedulerOutput) -> bool:
    """Every request feeds its one pending token and samples; nothing was preempted."""
    items = scheduled.scheduled_requests
    return (
        bool(items)
        and scheduled.num_decode_requests == len(items)
        and not scheduled.preempted_request_ids
        and all(item.num_new_tokens == 1 and not item.num_draft_tokens for item in items)
    )


@torch.inference_mode()
def sample_on_device(
    sampler: Sampler,
    logits: torch.Tensor,
    rows: Sequence[SamplingRow],
    greedy: torch.Tensor | None = None,
) -> torch.Tensor:
    """`Sampler.sample` for rows that need no host tokens (`needs_host_tokens` is False): the
    same tokens, left on the logits' device ([N] int64) instead of read back. `greedy`: the
    rows' argmax that the step already picked (ModelRunner.last_greedy). Returned as it is when
    every row is greedy: fed back to the runner, it then never leaves the runner's buffer."""
    raw = logits.float()
    random_rows = [i for i, row in enumerate(rows) if not row.params.greedy]
    if greedy is None or greedy.shape[0] != raw.shape[0]:
        tokens = raw.argmax(dim=-1)
    else:
        tokens = greedy.clone() if random_rows else greedy
    if random_rows:
        index = to_device(random_rows, raw.device)
        # NOTE: the sampler's own draw, so that seeded requests draw exactly as they do there
        tokens[index] = sampler._draw(raw[index], [rows[i] for i in random_rows])
    return tokens


# Deferred host work (Speculator.background_work) runs while the host waits for a step's tokens
# only where those waits have lately averaged at least MIN_SLACK_S: a chunk of it (~20 us on the
# H200 host) may run past the moment the tokens are ready, and where the host sets the pace
# (gpt-oss-mini at batch 8 waits ~0-40 us a step) that overshoot lengthened every step: auto's
# plain steps took 0.362 ms against 0.322 without a speculator (session 11, guard_accounting.py).
# Where the GPU sets the pace (120b: ~2 ms steps, ~0.3 ms of host work) the work stays free.
MIN_SLACK_S = 100e-6
SLACK_ALPHA = 0.1  # the average's weight of the newest wait (it spans about ten steps)


class HostSlack:
    """How long the host has lately waited for the GPU's tokens (an exponential average of its
    waits), which decides whether deferred work may fill the next wait."""

    def __init__(self) -> None:
        self.average_s = 0.0

    def fills(self, work: Callable[[], bool] | None) -> Callable[[], bool] | None:
        """`work` where the waits are long enough to take it, else None."""
        return work if self.average_s >= MIN_SLACK_S else None

    def wait_for(self, step: InFlightStep, work: Callable[[], bool] | None) -> dict[str, list[int]]:
        """`step.sampled_token_ids`, with `work` in the wait where it fits; times the wait."""
        start = time.perf_counter()
        sampled = step.sampled_token_ids(self.fills(work))
        self.average_s += SLACK_ALPHA * (time.perf_counter() - start - self.average_s)
        return sampled


class InFlightStep:
    """A launched step whose sampled tokens ([num rows] int64, on the device, in the order of
    `scheduled.scheduled_requests`) are on their way to the host."""

    def __init__(self, scheduled: SchedulerOutput, tokens: torch.Tensor) -> None:
        self.scheduled = scheduled
        self.tokens = tokens
        self.request_ids = [item.request_id for item in scheduled.scheduled_requests]
        self._event = None
        if tokens.is_cuda:
            # queued right behind the sampling, so waiting for it never waits for a later step
            self._host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            self._host.copy_(tokens, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host = tokens

    def sampled_token_ids(
        self, while_waiting: Callable[[], bool] | None = None
    ) -> dict[str, list[int]]:
        """Per request id, its sampled token (waits for this step's tokens only). Until they
        are ready, `while_waiting` is called again and again as long as it returns True (it has
        more to do): deferred host work that then costs the step nothing."""
        if self._event is not None:
            while while_waiting is not None and not self._event.query() and while_waiting():
                pass
            self._event.synchronize()
        tokens = self._host.tolist()
        return {rid: [token] for rid, token in zip(self.request_ids, tokens, strict=True)}

    def tokens_for(self, following: SchedulerOutput) -> torch.Tensor:
        """The device tokens to feed `following`, a continuation over some of this step's
        requests in the same order: all of them, or the rows of those still running."""
        ids = [item.request_id for item in following.scheduled_requests]
        if ids == self.request_ids:
            return self.tokens
        row = {rid: i for i, rid in enumerate(self.request_ids)}
        return self.tokens[to_device([row[rid] for rid in ids], self.tokens.device)]
