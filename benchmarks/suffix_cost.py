"""(CPU) The suffix proposer's host cost per engine step, as the speculator calls it.

    python benchmarks/suffix_cost.py                      # batch 8, 1k-token prompts, 256 steps
    python benchmarks/suffix_cost.py --profile 25         # + cProfile's top 25 of the timed batch

A batch of requests with text-like prompts (phrases of a small vocabulary, with whole passages
copied) decodes `--steps` steps. Each step does what Speculator.after_step does for a proposer:
`observe`, then one `propose` call for the batch, and each request then gains the tokens a target
would emit: the drafts that agree with the request's own (predetermined) continuation, plus one.
A first batch runs and ends before the timed one, so the shared trie of finished outputs has a
backlog to take in while the timed batch decodes (as in spec_decode.py e2e after its warm-up).

Reported: the first proposal for the timed batch (it builds each request's index), and the host
time of every later step (mean, p50, max over steps, and the mean per request), best of
`--repeats` runs. Times are this process's CPU time (time.process_time), so that other work on a
shared machine does not inflate them; `--wall` times wall-clock instead. The drafts' checksum
must not change when only the proposer's speed does.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import pstats
import random
import statistics
import time

from gossamer.runner.sampler import SamplingRow
from gossamer.sampling_params import SamplingParams
from gossamer.spec.build import build_speculator
from gossamer.spec.config import SpecConfig
from gossamer.spec.proposer import SpecRequest
from gossamer.spec.suffix import SuffixProposer

ROW = SamplingRow(SamplingParams(temperature=0), [], [], None)


def text_tokens(
    length: int, rng: random.Random, phrases: list[list[int]], copy_prob=0.15, copy_lengths=(16, 64)
) -> list[int]:
    """Phrases in random order; now and then (`copy_prob`) a copy of an earlier passage (quoted
    code, a template repeated), which is what gives the suffix proposer long matches."""
    shortest, longest = copy_lengths
    tokens: list[int] = []
    while len(tokens) < length:
        if len(tokens) > shortest and rng.random() < copy_prob:
            start = rng.randrange(len(tokens) - shortest)
            tokens += tokens[start : start + rng.randint(shortest, longest)]
        else:
            tokens += rng.choice(phrases)
    return tokens[:length]


def make_batch(args, seed: int) -> list[tuple[list[int], list[int]]]:
    """(prompt, the text it continues with) per request. Every batch draws on one set of
    phrases (one domain, as the chat prompts of e2e share their wording), so finished outputs
    help later requests a little."""
    vocab = random.Random(args.seed)
    phrases = [
        [vocab.randrange(args.vocab) for _ in range(vocab.randint(3, 12))]
        for _ in range(args.phrases)
    ]
    rng = random.Random(seed)
    total = args.prompt_tokens + args.steps * (args.k + 1)
    texts = [text_tokens(total, rng, phrases) for _ in range(args.batch)]
    return [(text[: args.prompt_tokens], text[args.prompt_tokens :]) for text in texts]


class Batch:
    """Requests decoding together; `step` is one engine step's proposer work."""

    def __init__(self, args, seed: int, prefix: str) -> None:
        self.k = args.k
        self.requests = [
            (f"{prefix}{i}", list(prompt), len(prompt), continuation)
            for i, (prompt, continuation) in enumerate(make_batch(args, seed))
        ]
        self.max_tokens = args.steps  # output tokens per request, as e2e's --max-tokens
        self.digest = hashlib.sha256()

    def specs(self) -> list[SpecRequest]:
        specs = []
        for request_id, tokens, num_prompt, _ in self.requests:
            room = min(self.k, self.max_tokens - (len(tokens) - num_prompt) - 1)
            if room >= 1:
                specs.append(SpecRequest(request_id, tokens, num_prompt, room, ROW))
        return specs

    def propose(self, proposer: SuffixProposer) -> None:
        proposer.observe(None, {})  # the speculator calls it every step (a no-op for suffix)
        specs = self.specs()
        drafts = proposer.propose(specs)
        self._pending = dict(zip((s.request_id for s in specs), drafts, strict=True))

    def advance(self) -> None:
        """Each request gains the drafts its continuation agrees with, plus one token."""
        for request_id, tokens, num_prompt, continuation in self.requests:
            done = len(tokens) - num_prompt
            if done >= self.max_tokens:
                continue
            draft = self._pending.get(request_id)
            drafted = draft.token_ids if draft is not None else []
            self.digest.update(repr((request_id, drafted)).encode())
            accepted = 0
            while accepted < len(drafted) and drafted[accepted] == continuation[done + accepted]:
                accepted += 1
            gained = min(accepted + 1, self.max_tokens - done)
            tokens += continuation[done : done + gained]

    def finished(self) -> bool:
        return all(len(t) - n >= self.max_tokens for _, t, n, _ in self.requests)

    def release(self, proposer: SuffixProposer) -> None:
        for request_id, tokens, num_prompt, _ in self.requests:
            proposer.release(request_id, tokens, num_prompt)


def run(args) -> dict[str, float]:
    clock = time.perf_counter if args.wall else time.process_time
    config = SpecConfig(method="suffix", num_speculative_tokens=args.k)
    # as the engine builds it (a suffix proposer needs no model)
    proposer = build_speculator(config, None, None, 0).proposers["suffix"]
    if not args.no_warmup_batch:
        earlier = Batch(args, seed=args.seed + 1000, prefix="warm")
        while not earlier.finished():
            earlier.propose(proposer)
            earlier.advance()
        earlier.release(proposer)
    batch = Batch(args, seed=args.seed + 1, prefix="r")
    start = clock()
    batch.propose(proposer)
    first = clock() - start
    batch.advance()
    profiler = cProfile.Profile() if args.profile else None
    steps, taking_in = [], []  # taking_in: whether the shared trie had outputs queued
    while not batch.finished():
        taking_in.append(proposer.shared.backlog > 0)
        start = clock()
        if profiler is not None:
            profiler.enable()
        batch.propose(proposer)
        if profiler is not None:
            profiler.disable()
        steps.append(clock() - start)
        batch.advance()
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile)
    busy = [seconds for seconds, taking in zip(steps, taking_in, strict=True) if taking]
    plain = [seconds for seconds, taking in zip(steps, taking_in, strict=True) if not taking]
    return {
        "first_ms": 1e3 * first,
        "steps": len(steps),
        "mean_us": 1e6 * statistics.fmean(steps),
        "p50_us": 1e6 * statistics.median(steps),
        "max_us": 1e6 * max(steps),
        "mean_us_per_request": 1e6 * statistics.fmean(steps) / args.batch,
        "taking_in": sum(taking_in),
        "taking_in_mean_us": 1e6 * _mean(busy),
        "plain_mean_us": 1e6 * _mean(plain),
        "digest": batch.digest.hexdigest()[:12],
    }


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=256, help="output tokens per request")
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--vocab", type=int, default=2000)
    parser.add_argument("--phrases", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=5, help="best of (by mean step time)")
    parser.add_argument("--wall", action="store_true", help="wall-clock, not CPU time")
    parser.add_argument("--no-warmup-batch", action="store_true")
    parser.add_argument("--profile", type=int, default=0, help="print cProfile's top N")
    args = parser.parse_args()
    results = [run(args) for _ in range(1 if args.profile else args.repeats)]
    best = min(results, key=lambda r: r["mean_us"])
    first = min(r["first_ms"] for r in results)
    print(
        f"batch {args.batch}, prompts {args.prompt_tokens} tokens, {best['steps']} steps: "
        f"first proposal {first:.2f} ms; step mean {best['mean_us']:.1f} us, "
        f"p50 {best['p50_us']:.1f} us, max {best['max_us']:.1f} us "
        f"({best['mean_us_per_request']:.1f} us per request); drafts {best['digest']}"
    )
    if best["taking_in"]:
        print(
            f"  {best['taking_in']} steps while the shared trie took in finished outputs: mean "
            f"{best['taking_in_mean_us']:.1f} us; the other steps: {best['plain_mean_us']:.1f} us"
        )


if __name__ == "__main__":
    main()
