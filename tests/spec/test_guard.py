"""The measured guard (gossamer/spec/guard.py): per batch bucket, speculation stays on only while
its measured tokens per second beat plain decoding's; windows of the other mode re-measure. With a
fake clock every decision is deterministic, and outputs never change."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from gossamer.sampling_params import SamplingParams
from gossamer.spec.config import SpecConfig, SpecConfigError, parse_spec_config
from gossamer.spec.guard import WARMUP_STEPS, MeasuredGuard, bucket_of
from tests.spec.conftest import FREE_VERIFICATION, make_engine, repetitive_prompts, run_engine

EVERY, WINDOW = 12, 3  # explore_every, explore_steps
# steps a window takes: its first is not measured (WARMUP_STEPS)
LONG, SHORT = EVERY + WARMUP_STEPS, WINDOW + WARMUP_STEPS


def feed(guard: MeasuredGuard, batch: int, steps: int, seconds: dict[bool, float], tokens) -> list:
    """Run `steps` decisions of `batch` decodes, each step taking seconds[mode] and emitting
    tokens[mode] per request; returns the modes in order."""
    modes = []
    for _ in range(steps):
        mode = guard.allows(batch)
        modes.append(mode)
        guard.record(batch, mode, seconds[mode], batch * tokens[mode])
    return modes


def runs(modes: list[bool]) -> list[tuple[bool, int]]:
    """[(mode, length of its run), ...]."""
    out: list[tuple[bool, int]] = []
    for mode in modes:
        if out and out[-1][0] == mode:
            out[-1] = (mode, out[-1][1] + 1)
        else:
            out.append((mode, 1))
    return out


def test_buckets_are_powers_of_two():
    assert [bucket_of(b) for b in (1, 2, 3, 4, 5, 8, 9, 32, 33)] == [1, 2, 4, 4, 8, 8, 16, 32, 64]


def test_slower_speculation_is_switched_off_and_explored_again_now_and_then():
    guard = MeasuredGuard(EVERY, WINDOW, margin=0.05)
    # auto on mini at batch 8 on the H200: 1.30 tokens per request a step (2048 in 197 steps)
    # in 1.58 ms, against 1 token in 0.91 ms
    # a first window of speculation, one of plain decoding, then plain with short spec windows
    expected = [(True, SHORT), (False, SHORT + LONG), (True, SHORT), (False, LONG), (True, SHORT)]
    expected += [(False, LONG)]
    steps = sum(length for _, length in expected)
    modes = feed(guard, 8, steps, {True: 1.58e-3, False: 0.91e-3}, {True: 1.30, False: 1.0})
    assert runs(modes) == expected
    stats = guard.stats()
    assert stats["guard_b8_speculating"] == 0.0 and stats["guard_b8_switches"] == 1
    assert stats["guard_b8_plain_tokens_per_s"] == pytest.approx(8 / 0.91e-3)
    assert stats["guard_b8_spec_tokens_per_s"] == pytest.approx(8 * 1.30 / 1.58e-3)
    assert guard.allows(8) and guard.buckets[8].exploring  # the next window explores
    assert guard.allows(5) and len(guard.buckets) == 1  # 5 shares bucket 8


def test_faster_speculation_stays_on_with_short_plain_windows():
    guard = MeasuredGuard(EVERY, WINDOW, margin=0.05)
    # auto on mini at batch 1: 1.62 tokens a step (256 in 158) in 0.68 ms against 1 in 0.58 ms
    expected = [(True, SHORT), (False, SHORT), (True, LONG), (False, SHORT), (True, LONG)]
    steps = sum(length for _, length in expected)
    modes = feed(guard, 1, steps, {True: 0.68e-3, False: 0.58e-3}, {True: 1.62, False: 1.0})
    assert runs(modes) == expected
    assert guard.stats()["guard_b1_speculating"] == 1.0


def test_hysteresis_keeps_the_choice_when_the_other_mode_is_barely_faster():
    guard = MeasuredGuard(EVERY, WINDOW, margin=0.05)
    # plain 3% faster per token: within the margin, speculation stays
    feed(guard, 2, 2 * SHORT, {True: 1.03, False: 1.0}, {True: 1.0, False: 1.0})
    assert guard.allows(2) and guard.buckets[2].num_switches == 0
    # once plain is chosen, speculation 3% faster does not win it back either
    feed(guard, 2, LONG + SHORT, {True: 2.0, False: 1.0}, {True: 1.0, False: 1.0})
    assert not guard.allows(2)
    feed(guard, 2, LONG + SHORT, {True: 0.97, False: 1.0}, {True: 1.0, False: 1.0})
    assert not guard.allows(2) and guard.buckets[2].num_switches == 1


def test_a_stall_is_capped_and_does_not_condemn_a_mode():
    guard = MeasuredGuard(EVERY, WINDOW, margin=0.05)
    guard.record(1, True, 50.0, 2)  # the window's first step: not measured
    guard.record(1, True, 1.0, 2)
    guard.record(1, True, 100.0, 2)  # a pause of the caller: counted as 4x the average
    assert guard.buckets[1].rates[True].seconds == pytest.approx(1 + 0.5 * 3)


def test_tokens_are_compared_per_request_across_the_batches_of_a_bucket():
    guard = MeasuredGuard(EVERY, WINDOW, margin=0.05)
    # bucket 8: speculation measured at batch 8, plain at batch 5, the same step time: per
    # request speculation emits 1.5 tokens a step against 1, though plain at 5 emits fewer in all
    for _ in range(SHORT):
        guard.record(8, True, 1.0, 12)
    for _ in range(SHORT):
        guard.record(5, False, 1.0, 5)
    assert guard.allows(8)


# ---- config -------------------------------------------------------------------------------------


def test_off_unless_asked_for():
    assert not parse_spec_config("auto").guards_speculation
    assert not parse_spec_config('{"method": "ngram", "cost_aware": true}').guards_speculation
    assert not parse_spec_config("ngram").guards_speculation
    assert not parse_spec_config('{"method": "auto", "measured_guard": false}').guards_speculation
    assert parse_spec_config('{"method": "auto", "measured_guard": true}').guards_speculation
    assert parse_spec_config('{"method": "suffix", "measured_guard": true}').guards_speculation


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"measured_guard": "yes"}, "measured_guard must be true, false or null"),
        ({"explore_every": 0}, "explore_every must be an integer >= 1"),
        ({"explore_steps": 2.5}, "explore_steps must be an integer >= 1"),
        ({"guard_margin": 1.0}, r"guard_margin must be in \[0, 1\)"),
        ({"guard_margin": "x"}, "speculative config"),
    ],
)
def test_bad_guard_settings_raise_typed_errors(value, message):
    with pytest.raises(SpecConfigError, match=message):
        parse_spec_config({"method": "auto"} | value)


# ---- in the engine, with a fake clock ------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


PARAMS = SamplingParams(temperature=0, max_tokens=80, ignore_eos=True)


def guarded_run(target, target_path, verify_cost: float, **options):
    """Two requests, the target drafting for itself (every draft accepted, 5 tokens a step), on
    a fake clock: a plain step takes 1 s, a verification step `verify_cost` s, proposing none.
    Returns (tokens, per decode-only step whether it verified drafts, spec stats)."""
    spec = SpecConfig(
        method="auto",
        model=str(target_path),
        methods=("draft",),
        num_speculative_tokens=4,
        cost_table=FREE_VERIFICATION,
        charge_proposer_time=False,
        explore_every=EVERY,
        explore_steps=WINDOW,
        measured_guard=True,
        **options,
    )
    engine = make_engine(target, spec)
    clock = FakeClock()
    engine.speculator.clock = clock
    verified: list[bool] = []

    def timed_run(seqs, run=engine.runner.run):
        drafts = any(seq.num_logits > 1 for seq in seqs)
        if all(seq.num_logits == len(seq.token_ids) for seq in seqs):  # decodes only
            verified.append(drafts)
        clock.now += verify_cost if drafts else 1.0
        return run(seqs)

    engine.runner.run = timed_run
    requests = {str(i): (p, PARAMS) for i, p in enumerate(repetitive_prompts(2, seed=21))}
    tokens, _, _ = run_engine(engine, requests)
    return tokens, verified, engine.stats.spec_stats


@pytest.fixture(scope="module")
def plain_tokens(target):
    requests = {str(i): (p, PARAMS) for i, p in enumerate(repetitive_prompts(2, seed=21))}
    return run_engine(make_engine(target, None), requests)[0]


def test_the_engine_turns_slow_speculation_off_and_explores_again(
    target, target_path, plain_tokens
):
    # 5 tokens per request in 10 s against 1 in 1 s: plain decoding wins
    tokens, verified, stats = guarded_run(target, target_path, verify_cost=10.0)
    assert tokens == plain_tokens
    assert stats["guard_b2_speculating"] == 0.0 and stats["num_guard_off_steps"] > 0
    assert stats["guard_b2_plain_tokens_per_s"] == pytest.approx(2.0)
    assert stats["guard_b2_spec_tokens_per_s"] == pytest.approx(1.0)
    pattern = runs(verified)
    # speculation first (its first proposal is not measured: one step more), then plain only,
    # but for windows of speculation every EVERY plain steps
    assert pattern[0] == (True, SHORT + 1)
    assert pattern[1] == (False, SHORT + LONG)
    assert pattern[2] == (True, SHORT)
    assert pattern[3] == (False, LONG)
    assert len(pattern) >= 5  # the last run may be cut short by the requests' end
    assert all(length == SHORT for mode, length in pattern[2:-1:2])


def test_the_engine_keeps_fast_speculation_on(target, target_path, plain_tokens):
    # 5 tokens per request in 1.5 s against 1 in 1 s: speculation wins
    tokens, verified, stats = guarded_run(target, target_path, verify_cost=1.5)
    assert tokens == plain_tokens
    assert stats["guard_b2_speculating"] == 1.0 and stats["guard_b2_switches"] == 0
    pattern = runs(verified)
    assert pattern[:2] == [(True, SHORT + 1), (False, SHORT)] and pattern[2][0]
    assert sum(verified) > 2 * (len(verified) - sum(verified))


def test_greedy_outputs_are_unchanged_whatever_the_guard_decides(target, plain_tokens):
    """auto (ngram + suffix, the cost model) with the guard on the real clock, and with a fake
    clock on which plain and speculating steps cost the same (the guard flaps as it likes)."""
    requests = {str(i): (p, PARAMS) for i, p in enumerate(repetitive_prompts(2, seed=21))}
    for fake in (False, True):
        spec = SpecConfig(
            method="auto", measured_guard=True, explore_every=4, explore_steps=2, guard_margin=0.0
        )
        engine = make_engine(target, spec)
        if fake:
            clock = FakeClock()
            engine.speculator.clock = clock
            run = engine.runner.run

            def ticking_run(seqs, run=run, clock=clock):
                clock.now += 1.0
                return run(seqs)

            engine.runner.run = ticking_run
        tokens, _, _ = run_engine(engine, requests)
        assert tokens == plain_tokens
        stats = engine.stats.spec_stats
        assert stats["num_drafts"] > 0 and "guard_b2_speculating" in stats


ROOT = Path(__file__).resolve().parents[2]


def spec_decode_benchmark():
    """benchmarks/spec_decode.py as a module."""
    spec = importlib.util.spec_from_file_location(
        "spec_decode_guard_bench", ROOT / "benchmarks" / "spec_decode.py"
    )
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses look their module up there
    spec.loader.exec_module(bench)
    return bench


def test_the_benchmark_compares_auto_with_and_without_the_guard():
    bench = spec_decode_benchmark()
    args = bench.parse_args(["e2e", "--model", "m", "--methods", "none,auto,auto-guard"])
    configs = bench.method_configs(args)
    assert list(configs) == ["none", "auto", "auto-guard"]
    assert configs["auto-guard"].guards_speculation and not configs["auto"].guards_speculation
    assert "auto-guard" not in bench.method_configs(bench.parse_args(["e2e", "--model", "m"]))
    row = bench.E2eRow("auto-guard", 8, 16, 1.0, 16.0, 1.0, 1.0, 0.0, 1.0, 1.0, {})
    row.guard = {"guard_b8_speculating": 0.0, "num_guard_off_steps": 3}
    assert "measured guard: guard_b8_speculating 0, num_guard_off_steps 3" in row.line()


# ---- on the GPU ----------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_mini_guarded_auto_does_not_lose_at_batch_8():
    """The benchmark's workload on gpt-oss-mini at batch 8, 256 tokens each, after a warm-up run
    on other prompts (where the guard learns): auto with the guard is no more than 10% slower
    than plain decoding (the cost model alone: 0.75x), and says what it chose."""
    from gossamer.engine.core import EngineConfig, EngineCore
    from gossamer.model.loader import load_model

    bench = spec_decode_benchmark()
    loaded = load_model(str(ROOT / "gossamer" / "models" / "gpt-oss-mini"), device="cuda")
    speeds, stats = {}, {}
    for name, spec in (("none", None), ("auto", SpecConfig(method="auto", measured_guard=True))):
        config = EngineConfig(max_num_seqs=8, kv_cache_memory=4 << 30, speculative_config=spec)
        engine = EngineCore(loaded.model, None, config)
        bench.run_workload(engine, bench.workload(loaded, 8, seed=1008), 256)
        generated, seconds, _ = bench.run_workload(engine, bench.workload(loaded, 8, seed=8), 256)
        speeds[name] = generated / seconds
        stats[name] = dict(engine.stats.spec_stats)
        del engine
    guard = {key: value for key, value in stats["auto"].items() if key.startswith("guard_")}
    print(f"tok/s {speeds}, auto/none {speeds['auto'] / speeds['none']:.2f}, guard {guard}")
    assert "guard_b8_speculating" in guard
    assert speeds["auto"] >= 0.9 * speeds["none"]
