"""The costs the cost-aware k decides with: the step-cost table timed on the engine's runner at
start-up (gossamer/spec/calibrate.py), and the proposers' host time charged against speculating
(gossamer/spec/cost.py)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from gossamer.engine.core import EngineConfig, EngineCore
from gossamer.model.loader import load_model
from gossamer.runner.model_runner import EagerGraphCapture, ModelRunner
from gossamer.sampling_params import SamplingParams
from gossamer.spec.calibrate import (
    calibrated_cost_table,
    calibration_batches,
    measure_cost_table,
    verify_seqs,
)
from gossamer.spec.config import SpecConfig
from gossamer.spec.cost import (
    DEFAULT_COST_TABLE,
    DraftLengthChooser,
    ProposerTime,
    StepCost,
    choose_draft_lens,
)
from gossamer.spec.ngram import NgramProposer
from gossamer.spec.speculator import Speculator
from tests.spec.conftest import FREE_VERIFICATION, make_engine, repetitive_prompts, run_engine

GRAPH_SIZES = (1, 2, 4, 8, 16, 24, 32)
LADDER = (1, 2, 4)  # num_speculative_tokens = 4


def fake_ms(batch: int, q: int) -> float:
    """The fake GPU's step: 2 ms, plus 0.1 ms per token fed."""
    return 2.0 + 0.1 * batch * q


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeRunner:
    """What the calibration reads of a ModelRunner; a step advances the fake clock."""

    block_size = 16
    max_blocks_per_seq = 8192 // 16
    num_groups = 2

    def __init__(self, clock: FakeClock, sizes=GRAPH_SIZES, query_lens=(1, 2, 3, 5)) -> None:
        self.clock = clock
        self.graphs = {(size, q): None for size in sizes for q in query_lens}
        self.step_modes: Counter[str] = Counter(graph=7)
        self.shapes: list[tuple[int, int]] = []

    def run(self, seqs):
        q = len(seqs[0].token_ids)
        assert all(len(seq.token_ids) == seq.num_logits == q for seq in seqs)
        self.shapes.append((len(seqs), q))
        self.clock.now += fake_ms(len(seqs), q) / 1e3
        self.step_modes["graph"] += 1
        return torch.zeros(len(seqs) * q, 4)


# ---- the measured table --------------------------------------------------------------------------


def test_the_table_has_a_row_per_batch_and_a_point_per_graph_k():
    clock = FakeClock()
    runner = FakeRunner(clock)
    table = measure_cost_table(runner, (0, *LADDER), num_blocks=100_000, timer=clock)
    assert [batch for batch, _ in table] == [1, 4, 16, 32]  # 1, 4, 16 and the largest
    for batch, points in table:
        assert [k for k, _ in points] == [0, 1, 2, 4]
        for k, ms in points:
            assert ms == pytest.approx(fake_ms(batch, 1 + k))
    assert runner.step_modes == Counter(graph=7)  # the engine's step counts leave it out
    assert set(runner.shapes) == {(b, 1 + k) for b in (1, 4, 16, 32) for k in (0, *LADDER)}


def test_the_batches_are_those_with_graphs_of_every_k():
    keys = {(size, q) for size in (1, 2, 4, 8) for q in (1, 2, 3, 5)}
    assert calibration_batches(keys, (0, 1, 2, 4)) == [1, 4, 8]
    assert calibration_batches(keys | {(16, 1)}, (0, 1, 2, 4)) == [1, 4, 8]  # no k > 0 at 16
    assert calibration_batches({(1, 1)}, (0, 1)) == []


def test_the_stand_in_sequences_read_blocks_of_their_own():
    seqs = verify_seqs(3, 2, 40, blocks_per_seq=3, num_groups=2)
    assert [(len(s.token_ids), s.start, s.num_logits) for s in seqs] == [(3, 40, 3)] * 3
    blocks = [b for s in seqs for table in s.block_tables for b in table]
    assert sorted(blocks) == list(range(1, 1 + 3 * 2 * 3))  # block 0 is the null block
    small = verify_seqs(3, 2, 40, blocks_per_seq=3, num_groups=2, num_blocks=7)
    assert {b for s in small for table in s.block_tables for b in table} == set(range(1, 7))


def test_an_explicit_table_no_cost_model_or_no_graphs_keep_the_configured_costs():
    clock = FakeClock()
    auto = SpecConfig(method="auto")
    assert calibrated_cost_table(auto, FakeRunner(clock), 10_000, clock) is not None
    explicit = SpecConfig(method="auto", cost_table={"1": [1.0, 1.5]})
    assert calibrated_cost_table(explicit, FakeRunner(clock), 10_000, clock) is None
    plain_ngram = SpecConfig(method="ngram")  # a single method: no cost model
    assert calibrated_cost_table(plain_ngram, FakeRunner(clock), 10_000, clock) is None
    eager = FakeRunner(clock, sizes=())
    assert calibrated_cost_table(auto, eager, 10_000, clock) is None


def speculator(config: SpecConfig) -> Speculator:
    return Speculator(config, {"ngram": NgramProposer(config.num_speculative_tokens)})


def test_the_speculator_decides_with_the_measured_table():
    clock = FakeClock()
    spec = speculator(SpecConfig(method="auto", methods=("ngram",)))
    spec.calibrate(FakeRunner(clock), 10_000, clock)
    measured = StepCost(spec.measured_cost_table)
    assert spec.chooser.cost(4, 2) == pytest.approx(fake_ms(4, 3) / fake_ms(4, 1))
    assert spec.chooser.cost(8, 4) == pytest.approx(measured(8, 4))
    assert spec.chooser.cost(1, 1) != pytest.approx(StepCost(DEFAULT_COST_TABLE)(1, 1))
    # until the engine timed its own steps, the calibrated k = 0 step is the plain step
    assert spec.chooser.plain_step_seconds(4) == pytest.approx(fake_ms(4, 1) / 1e3)
    assert spec.chooser.plain_step_seconds(10) == pytest.approx(
        (fake_ms(4, 1) + (fake_ms(16, 1) - fake_ms(4, 1)) / 2) / 1e3
    )


def test_an_explicit_table_overrides_the_measurement():
    clock = FakeClock()
    table = {"1": [1.0, 1.5], "8": [1.0, 3.0]}
    spec = speculator(SpecConfig(method="auto", methods=("ngram",), cost_table=table))
    spec.calibrate(FakeRunner(clock), 10_000, clock)
    assert spec.measured_cost_table is None
    assert spec.chooser.cost(1, 1) == pytest.approx(1.5)
    assert spec.chooser.cost(8, 1) == pytest.approx(3.0)


def test_the_engine_calibrates_on_its_runner(target):
    """A CPU runner with graphs captured eagerly (EagerGraphCapture replays them): the engine
    times its uniform verification steps at start-up, and decoding is unchanged."""
    spec = SpecConfig(method="auto", methods=("ngram",), num_speculative_tokens=2)
    runner = ModelRunner(
        target, num_blocks=400, block_size=4, max_num_seqs=4, max_num_batched_tokens=512
    )
    runner.capture_graphs([1, 2, 4], (1, 2, 3), capture=EagerGraphCapture())
    config = EngineConfig(block_size=4, num_blocks=400, max_num_seqs=4, speculative_config=spec)
    engine = EngineCore(target, None, config, runner)
    table = engine.speculator.measured_cost_table
    assert [batch for batch, _ in table] == [1, 4]
    assert all([k for k, _ in points] == [0, 1, 2] for _, points in table)
    assert all(ms > 0 for _, points in table for _, ms in points)
    assert sum(runner.step_modes.values()) == 0  # the calibration's steps are not counted
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    requests = {str(i): (p, params) for i, p in enumerate(repetitive_prompts(2, seed=3))}
    plain, _, _ = run_engine(make_engine(target, None), requests)
    tokens, _, _ = run_engine(engine, requests)
    assert tokens == plain


def test_on_the_cpu_the_built_in_table_stays(target):
    engine = make_engine(target, SpecConfig(method="auto"))
    assert engine.speculator.measured_cost_table is None
    assert engine.speculator.chooser.cost(1, 3) == StepCost(DEFAULT_COST_TABLE)(1, 3)


# ---- host time -----------------------------------------------------------------------------------

HIGH = [0.9, 0.81, 0.73, 0.66]  # gains of a request whose drafts are accepted 90% of the time


@pytest.mark.parametrize("padded", [True, False])
def test_host_time_turns_speculation_off_when_large_and_leaves_it_on_when_small(padded):
    cost = StepCost(((8, ((0, 1.0), (1, 1.2), (2, 1.4), (4, 1.8))),))
    batch = [HIGH] * 8
    free = choose_draft_lens(batch, cost, LADDER, padded)
    assert sum(free) >= 8
    # 40 us of proposing per request against a 0.66 ms step: 0.48 plain steps for the batch
    small = choose_draft_lens(batch, cost, LADDER, padded, host_costs=[40e-6 / 0.66e-3] * 8)
    assert sum(small) >= 8
    # 0.5 ms per request: 6 plain steps of host time, more than any k can pay back
    large = choose_draft_lens(batch, cost, LADDER, padded, host_costs=[0.5e-3 / 0.66e-3] * 8)
    assert large == [0] * 8


def test_ragged_steps_charge_only_the_requests_that_get_drafts():
    cost = StepCost(((2, ((0, 1.0), (4, 1.0))),))  # free verification
    gains = [HIGH, [0.2]]
    # the second request's one draft (0.2 tokens) does not pay for its 0.5 steps of proposing
    assert choose_draft_lens(gains, cost, LADDER, False, host_costs=[0.05, 0.5]) == [4, 0]
    assert choose_draft_lens(gains, cost, LADDER, False) == [4, 1]


def chooser_with_history(accepted: bool = True) -> DraftLengthChooser:
    chooser = DraftLengthChooser(FREE_VERIFICATION_TABLE, LADDER, 4, window=8)
    for step in range(20):
        for request in range(8):
            chooser.record(f"r{request}", "suffix", 4, 4 if accepted else 0, step)
    return chooser


FREE_VERIFICATION_TABLE = ((1, ((0, 1.0), (1, 1.0))),)
WANTED = [(f"r{request}", "suffix", 4) for request in range(8)]


def choose(chooser: DraftLengthChooser, step: int = 20) -> list[int]:
    return chooser.choose(WANTED, 8, True, 8192, step, charge_host=True)


def test_the_chooser_charges_the_measured_proposer_time():
    chooser = chooser_with_history()
    chooser.record_step_time(8, 0, 0.66e-3)  # a plain step of 0.66 ms at batch 8
    assert choose(chooser) == [4] * 8  # no proposer time measured yet: nothing charged
    chooser.record_proposer_time("suffix", 8 * 40e-6, 8, step=20)
    assert choose(chooser) == [4] * 8  # 40 us per request: 0.5 steps, 32 tokens pay for it
    slow = chooser_with_history()
    slow.record_step_time(8, 0, 0.66e-3)
    slow.record_proposer_time("suffix", 8 * 2e-3, 8, step=20)  # 2 ms each: 24 plain steps
    assert choose(slow) == [0] * 8
    assert slow.choose(WANTED, 8, True, 8192, 20, charge_host=False) == [4] * 8  # drafts known


def test_a_proposer_left_off_for_its_time_is_tried_again():
    slow = chooser_with_history()
    slow.record_step_time(8, 0, 0.66e-3)
    slow.record_proposer_time("suffix", 8 * 1e-3, 8, step=20)  # 12 plain steps
    assert choose(slow, step=20) == [0] * 8
    assert choose(slow, step=400) == [4] * 8  # the estimate faded toward 0: explore again


def test_proposer_time_is_a_running_average_per_request():
    times = ProposerTime(alpha=0.5, decay=0.9)
    times.record("ngram", 8e-3, 8, step=1)
    assert times.per_request("ngram", 1) == pytest.approx(1e-3)
    times.record("ngram", 6e-3, 2, step=1)
    assert times.per_request("ngram", 1) == pytest.approx(2e-3)
    assert times.per_request("ngram", 3) == pytest.approx(2e-3 * 0.81)
    assert times.per_request("suffix", 3) == 0.0


def test_the_engine_step_time_is_normalised_by_its_cost():
    chooser = DraftLengthChooser(((4, ((0, 1.0), (2, 2.0))),), LADDER, 4, window=8)
    assert chooser.plain_step_seconds(4) is None  # no calibration, no step: no host charge
    chooser.record_step_time(4, 8, 2e-3)  # k = 2 costs 2 plain steps
    assert chooser.plain_step_seconds(4) == pytest.approx(1e-3)
    chooser.record_step_time(4, 0, 1.0)  # a stall: capped at 4x the estimate
    assert chooser.plain_step_seconds(4) < 2e-3


def test_a_slow_proposer_turns_auto_off_in_the_engine(target):
    """ngram made slow (80 ms per call, tens of plain steps of the tiny CPU model): the first
    (untimed: it may build indexes) and second proposals happen, then the cost model stops
    proposing; uncharged, the same proposer drafts on."""
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    requests = {"0": (repetitive_prompts(1, seed=21)[0], params)}
    runs = {}
    for charge in (True, False):
        spec = SpecConfig(
            method="auto",
            methods=("ngram",),
            cost_table=FREE_VERIFICATION,
            charge_proposer_time=charge,
            measured_guard=False,  # the cost model's charge alone
        )
        engine = make_engine(target, spec)
        proposer = engine.speculator.proposers["ngram"]
        calls = []

        def slow_propose(group, propose=proposer.propose, calls=calls):
            calls.append(len(group))
            time.sleep(0.08)
            return propose(group)

        proposer.propose = slow_propose
        tokens, _, _ = run_engine(engine, requests)
        runs[charge] = (tokens, len(calls), engine.stats.spec_stats)
    charged, free = runs[True], runs[False]
    assert charged[0] == free[0]
    assert charged[1] <= 3 < free[1]
    assert charged[2]["num_cost_off_steps"] > 0
    assert charged[2]["ngram_propose_us_per_request"] > 20_000  # 80 ms, faded since


def test_a_faster_reading_at_a_larger_k_is_taken_as_noise():
    clock = FakeClock()
    runner = FakeRunner(clock, sizes=(1,))
    steps = iter([3.0, 2.0, 4.0])  # ms at k = 0, 1, 2 (one step each, no warm-up timed)

    def run(seqs):
        if runner.timed:
            clock.now += next(steps) / 1e3
        runner.timed = not runner.timed  # every other run is the warm-up
        return torch.zeros(len(seqs) * len(seqs[0].token_ids), 4)

    runner.timed = False
    runner.run = run
    table = measure_cost_table(runner, (0, 1, 2), num_blocks=1000, steps=1, timer=clock)
    ((batch, points),) = table
    assert batch == 1 and [k for k, _ in points] == [0, 1, 2]
    assert [ms for _, ms in points] == pytest.approx([3.0, 3.0, 4.0])


# ---- on the GPU ----------------------------------------------------------------------------------

MINI = Path(__file__).resolve().parents[2] / "gossamer" / "models" / "gpt-oss-mini"


@pytest.mark.gpu
def test_gpu_mini_times_its_verification_steps():
    """gpt-oss-mini with graphs: the engine times k = 0, 1, 2, 4 at batch 1, 4 and 16 at
    start-up, in well under a second; costs grow with k and with the batch."""
    model = load_model(str(MINI), device="cuda", dtype="bfloat16", max_model_len=2048).model
    spec = SpecConfig(method="auto", num_speculative_tokens=4)
    engine = EngineCore(
        model,
        None,
        EngineConfig(max_num_seqs=16, kv_cache_memory=2 << 30, speculative_config=spec),
    )
    table = engine.speculator.measured_cost_table
    print("mini step costs (ms):", table, f"in {engine.speculator.calibration_seconds:.2f} s")
    assert [batch for batch, _ in table] == [1, 4, 16]
    assert all([k for k, _ in points] == [0, 1, 2, 4] for _, points in table)
    assert engine.speculator.calibration_seconds < 1.0
    for _, points in table:
        costs = [ms for _, ms in points]
        assert costs == sorted(costs) and costs[0] > 0
    assert table[-1][1][0][1] >= 0.9 * table[0][1][0][1]  # k = 0: batch 16 no faster than 1
    chooser = engine.speculator.chooser
    assert chooser.cost(4, 2) == pytest.approx(table[1][1][2][1] / table[1][1][0][1])
    assert sum(engine.runner.step_modes.values()) == 0
    # decoding still works after the calibration wrote KV blocks of the empty pool
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    requests = {str(i): (p, params) for i, p in enumerate(repetitive_prompts(4, seed=9))}
    tokens, _, _ = run_engine(engine, requests)
    assert all(len(t) == 32 for t in tokens.values())
