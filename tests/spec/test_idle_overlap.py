"""Speculation that is idle at the running batch (Speculator.idle_for) costs nothing: with overlapped
scheduling (EngineConfig.async_scheduling) the engine then runs its plain decode steps ahead, as
without a speculator, proposes nothing while a step is in flight, and speculates again once the
batch shrinks. Greedy outputs stay those of plain decoding, token for token."""

from __future__ import annotations

import pytest

from gossamer.sampling_params import SamplingParams
from gossamer.spec.config import SpecConfig
from gossamer.spec.cost import GENEROUS_ACCEPTANCE, DraftLengthChooser
from gossamer.spec.ngram import NgramProposer
from gossamer.spec.speculator import IDLE_REFRESH_STEPS, Speculator
from tests.spec.checkpoints import write_eagle3_checkpoint
from tests.spec.conftest import make_engine, repetitive_prompts, run_engine
from tests.spec.test_guard import FakeClock, runs

LIMIT = 3  # disable_by_batch_size of the engine tests
# the requests finish one after another, so the batch falls from 4 below LIMIT mid-run
MAX_TOKENS = (5, 9, 30, 36)
# step costs cheap at batch 1 and dear at 8: no k can pay at 4 or more, even at 0.8 per position
DEAR_AT_8 = {"1": [1.0, 1.05], "8": [1.0, 3.0]}


def shrinking_batch(max_tokens=MAX_TOKENS, seed: int = 3) -> dict:
    prompts = repetitive_prompts(len(max_tokens), seed=seed)
    return {
        f"r{i}": (prompt, SamplingParams(temperature=0, max_tokens=count, ignore_eos=True))
        for i, (prompt, count) in enumerate(zip(prompts, max_tokens, strict=True))
    }


@pytest.fixture(scope="module")
def plain(target):
    """Synchronous plain decoding of the shrinking batch."""
    return run_engine(make_engine(target, None), shrinking_batch())[0]


class StepLog:
    """The engine's runner calls: per decode-only step, its batch and whether it verified
    drafts (a sequence asks for more than one row of logits)."""

    def __init__(self, engine) -> None:
        self.steps: list[tuple[int, bool]] = []
        run = engine.runner.run

        def logged(seqs, **options):
            if all(seq.num_logits == len(seq.token_ids) for seq in seqs):
                self.steps.append((len(seqs), any(seq.num_logits > 1 for seq in seqs)))
            return run(seqs, **options)

        engine.runner.run = logged

    def drafted_at(self, batch_filter) -> bool:
        return any(drafts for batch, drafts in self.steps if batch_filter(batch))


# ---- in the engine -------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["ngram", "suffix", "auto"])
def test_idle_batches_overlap_and_speculation_resumes_when_the_batch_shrinks(method, target, plain):
    # the batch limit alone (auto's guard, on the real clock, could idle small batches too)
    spec = SpecConfig(
        method=method, num_speculative_tokens=3, disable_by_batch_size=LIMIT, measured_guard=False
    )
    engine = make_engine(target, spec, async_scheduling=True)
    log = StepLog(engine)
    tokens, _, _ = run_engine(engine, shrinking_batch())
    assert tokens == plain
    stats = engine.stats.spec_stats
    assert engine.num_overlapped_steps > 0
    assert stats["num_idle_overlapped_steps"] == engine.num_overlapped_steps
    assert stats["num_disabled_steps"] >= engine.num_overlapped_steps
    assert not log.drafted_at(lambda batch: batch >= LIMIT)  # idle: no drafts at all
    assert log.drafted_at(lambda batch: batch < LIMIT)  # the batch shrank: drafts again
    assert stats["num_drafts"] > 0 and stats["num_accepted_tokens"] > 0


def test_a_draft_model_catches_up_after_an_idle_stretch(target, target_path, plain):
    spec = SpecConfig(
        method="draft", model=str(target_path), num_speculative_tokens=3, disable_by_batch_size=3
    )
    engine = make_engine(target, spec, async_scheduling=True)
    tokens, _, _ = run_engine(engine, shrinking_batch())
    assert tokens == plain
    stats = engine.stats.spec_stats
    assert engine.num_overlapped_steps > 0
    # the target drafting for itself: every draft accepted once it caught up
    assert stats["acceptance_rate"] == 1.0 and stats["num_drafts"] > 0


def test_the_cost_model_idles_large_batches_and_speculates_in_small_ones(target):
    requests = shrinking_batch((4, 6, 8, 10, 12, 14, 30, 36), seed=5)
    plain_tokens, _, _ = run_engine(make_engine(target, None), requests)
    spec = SpecConfig(method="auto", num_speculative_tokens=3, cost_table=DEAR_AT_8)
    engine = make_engine(target, spec, async_scheduling=True)
    log = StepLog(engine)
    tokens, _, _ = run_engine(engine, requests)
    assert tokens == plain_tokens
    stats = engine.stats.spec_stats
    assert stats["num_idle_overlapped_steps"] == engine.num_overlapped_steps > 0
    assert stats["num_cost_off_steps"] >= engine.num_overlapped_steps
    assert not log.drafted_at(lambda batch: batch >= 4)
    assert log.drafted_at(lambda batch: batch <= 2) and stats["num_accepted_tokens"] > 0


def test_nothing_is_proposed_while_a_step_is_in_flight(target):
    """Drafts proposed during an overlapped apply would miss the in-flight step's token: every
    proposal happens with no step in flight, for a request at its full token count, and each
    draft is verified right after the token it was proposed for."""
    spec = SpecConfig(method="ngram", num_speculative_tokens=3, disable_by_batch_size=LIMIT)
    engine = make_engine(target, spec, async_scheduling=True)
    proposer = engine.speculator.proposers["ngram"]
    proposed: dict[str, list[int]] = {}  # request id -> token counts it was proposed at
    propose, sample = proposer.propose, engine.speculator.sample

    def spied_propose(requests):
        assert engine._in_flight is None
        for request in requests:
            scheduled = engine.scheduler.get_request(request.request_id)
            assert len(request.token_ids) == scheduled.num_tokens
            assert scheduled.num_computed_tokens == scheduled.num_tokens - 1
            proposed.setdefault(request.request_id, []).append(len(request.token_ids))
        return propose(requests)

    verified: list[tuple[str, int]] = []

    def spied_sample(logits, items, rows, generator):
        for item in items:
            # proposed drafts, not padding filler: the pending token sits at the count - 1
            if engine.speculator._real_draft(item):
                verified.append((item.request_id, item.start_position + 1))
        return sample(logits, items, rows, generator)

    proposer.propose = spied_propose
    engine.speculator.sample = spied_sample
    run_engine(engine, shrinking_batch())
    assert engine.num_overlapped_steps > 0 and verified
    assert all(count in proposed[request_id] for request_id, count in verified)


def test_requests_that_only_ran_idle_never_build_an_index(target, plain):
    """The suffix proposer builds a request's index at its first proposal: the two requests that
    finish while the batch is at the limit are never proposed for, the others are."""
    spec = SpecConfig(method="suffix", num_speculative_tokens=3, disable_by_batch_size=LIMIT)
    engine = make_engine(target, spec, async_scheduling=True)
    proposer = engine.speculator.proposers["suffix"]
    asked: set[str] = set()
    propose = proposer.propose

    def spied_propose(requests):
        asked.update(request.request_id for request in requests)
        return propose(requests)

    proposer.propose = spied_propose
    tokens, _, _ = run_engine(engine, shrinking_batch())
    assert tokens == plain
    assert asked == {"r2", "r3"}


def test_eagle3_never_runs_ahead(target3, tmp_path):
    """EAGLE-3 observes the hidden states of the step just run, which a step launched ahead
    would overwrite: its engine stays synchronous even while idle."""
    head = write_eagle3_checkpoint(
        tmp_path / "head", vocab_size=320, target_hidden_size=64, aux_layer_ids=(0, 1, 2)
    )
    requests = shrinking_batch()
    plain_tokens, _, _ = run_engine(make_engine(target3, None), requests)
    spec = SpecConfig(
        method="eagle3", model=str(head), num_speculative_tokens=2, disable_by_batch_size=LIMIT
    )
    engine = make_engine(target3, spec, async_scheduling=True)
    tokens, _, _ = run_engine(engine, requests)
    assert tokens == plain_tokens
    assert engine.num_overlapped_steps == 0
    assert engine.stats.spec_stats["num_disabled_steps"] > 0


def guarded_self_drafting(target_path, explore_every: int, explore_steps: int) -> SpecConfig:
    """auto with the target drafting for itself (every draft accepted) and verification free to
    the cost model: only the measured guard can keep a bucket plain."""
    return SpecConfig(
        method="auto",
        model=str(target_path),
        methods=("draft",),
        num_speculative_tokens=4,
        cost_table={"1": [1.0, 1.0]},
        charge_proposer_time=False,
        measured_guard=True,
        explore_every=explore_every,
        explore_steps=explore_steps,
    )


def test_the_guard_measures_overlapped_plain_steps_and_still_explores(target, target_path):
    """The measured guard keeps a bucket plain where speculation is slower (a fake clock: a
    plain step 1 s, a verification step 5.65 s for 5 tokens). Its plain windows then run
    overlapped, count as its plain samples (2 tokens per second), and its speculation windows
    still come."""
    every, window = 12, 3
    spec = guarded_self_drafting(target_path, every, window)
    engine = make_engine(target, spec, async_scheduling=True)
    clock = FakeClock()
    engine.speculator.clock = clock
    verified: list[bool] = []
    run = engine.runner.run

    def timed_run(seqs, **options):
        drafts = any(seq.num_logits > 1 for seq in seqs)
        if all(seq.num_logits == len(seq.token_ids) for seq in seqs):
            verified.append(drafts)
        clock.now += 5.65 if drafts else 1.0
        return run(seqs, **options)

    engine.runner.run = timed_run
    # long enough for two explorations (each that confirms plain waits until the exploration's
    # extra time is 2% of the plain steps': here the longest interval, 96 steps)
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    requests = {str(i): (p, params) for i, p in enumerate(repetitive_prompts(2, seed=21))}
    tokens, _, _ = run_engine(engine, requests)
    assert tokens == run_engine(make_engine(target, None), requests)[0]
    stats = engine.stats.spec_stats
    assert stats["guard_b2_speculating"] == 0.0
    assert stats["guard_b2_plain_tokens_per_s"] == pytest.approx(2.0)
    assert stats["guard_b2_spec_tokens_per_s"] == pytest.approx(10 / 5.65)
    assert stats["num_idle_overlapped_steps"] == engine.num_overlapped_steps > every
    assert stats["num_guard_off_steps"] >= engine.num_overlapped_steps
    speculating_runs = [length for mode, length in runs(verified) if mode]
    assert len(speculating_runs) >= 3  # the first window, then explorations between plain ones


# ---- the speculator's verdict --------------------------------------------------------------------


def speculator(**options) -> Speculator:
    config = SpecConfig(method="ngram", num_speculative_tokens=4, **options)
    return Speculator(config, {"ngram": NgramProposer(4)})


def test_idle_at_the_batch_limit():
    spec = speculator(disable_by_batch_size=4)
    assert not spec.idle_for(3) and spec.idle_for(4) and spec.idle_for(9)
    assert not speculator().idle_for(256)  # no limit, no cost model, no guard: never idle


def test_idle_where_the_guard_keeps_the_bucket_plain():
    spec = speculator(measured_guard=True)
    assert not spec.idle_for(8)  # a new bucket starts with a window of speculation
    spec.guard.buckets[8].mode = False
    assert spec.idle_for(8) and spec.idle_for(5) and not spec.idle_for(4)


def test_the_cost_verdict_is_kept_for_a_while_and_judged_again():
    spec = speculator(cost_aware=True, cost_table=DEAR_AT_8)
    assert not spec.idle_for(1) and not spec.idle_for(2)
    assert spec.idle_for(8) and spec.idle_for(4)
    # proposing found dear (5 s a request, a 1 s plain step): batch 1 cannot pay either
    chooser = spec.chooser
    chooser.step_time.seconds = 1.0
    chooser.record_proposer_time("ngram", 5.0, 1, step=0)
    assert not spec.idle_for(1)  # the verdict stands until it is judged again
    spec._step += IDLE_REFRESH_STEPS
    assert spec.idle_for(1)
    free = speculator(cost_aware=True, cost_table=DEAR_AT_8, charge_proposer_time=False)
    free.chooser.step_time.seconds = 1.0
    free.chooser.record_proposer_time("ngram", 5.0, 1, step=0)
    assert not free.idle_for(1)


def test_best_rates_start_generous_then_follow_the_best_method():
    chooser = DraftLengthChooser(SpecConfig(cost_table=DEAR_AT_8).cost_table, (1, 2, 4), 4, 8)
    assert chooser.best_rates(0) == [GENEROUS_ACCEPTANCE] * 4
    chooser.rates("x", "suffix", 0)  # looking up a method records nothing
    assert chooser.best_rates(0) == [GENEROUS_ACCEPTANCE] * 4
    for step in range(40):
        chooser.record(f"a{step}", "ngram", drafted=4, accepted=0, step=step)
    low = chooser.best_rates(40)
    assert low[0] < 0.1
    assert not chooser.can_pay(1, padded=True, token_budget=None, step=40)
    for step in range(40):
        chooser.record(f"b{step}", "suffix", drafted=4, accepted=4, step=step)
    assert chooser.best_rates(40)[0] > 0.9  # the best of both methods, position by position
    assert chooser.can_pay(1, padded=True, token_budget=None, step=40)
    assert not chooser.can_pay(8, padded=True, token_budget=None, step=40)
    assert not chooser.can_pay(1, padded=True, token_budget=1, step=40)  # no room for a draft


# ---- on the GPU ----------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_mini_idle_speculation_overlaps_as_plain_decoding_does():
    """The benchmark's workload on gpt-oss-mini at batch 8, 256 tokens each, every engine with
    overlapped scheduling: auto kept idle at that batch (disable_by_batch_size=8) overlaps its
    steps as plain decoding does and drafts nothing. (Its speed is printed, not asserted: tests
    check behaviour; benchmarks/spec_decode.py e2e measures speed.)"""
    from gossamer.engine.core import EngineConfig, EngineCore
    from gossamer.model.loader import load_model
    from tests.spec.test_guard import ROOT, spec_decode_benchmark

    bench = spec_decode_benchmark()
    loaded = load_model(str(ROOT / "gossamer" / "models" / "gpt-oss-mini"), device="cuda")
    idle_auto = SpecConfig(method="auto", disable_by_batch_size=8)
    speeds, overlapped, stats = {}, {}, {}
    for name, spec in (("none", None), ("auto", idle_auto)):
        config = EngineConfig(
            max_num_seqs=8,
            kv_cache_memory=4 << 30,
            speculative_config=spec,
            async_scheduling=True,
        )
        engine = EngineCore(loaded.model, None, config)
        bench.run_workload(engine, bench.workload(loaded, 8, seed=1008), 256)
        before = engine.num_overlapped_steps
        generated, seconds, _ = bench.run_workload(engine, bench.workload(loaded, 8, seed=8), 256)
        speeds[name] = generated / seconds
        overlapped[name] = engine.num_overlapped_steps - before
        stats[name] = dict(engine.stats.spec_stats)
        del engine
    print(f"tok/s {speeds}, auto/none {speeds['auto'] / speeds['none']:.3f}, {overlapped}")
    assert overlapped["auto"] >= overlapped["none"] - 2
    assert stats["auto"]["num_drafts"] == 0
