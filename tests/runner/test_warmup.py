"""The start-up warm-up reaches every Triton specialization that later steps launch, and changes
nothing: no KV written, no block taken, the same tokens afterwards.

No GPU here, so the Triton kernels are replaced by recorders: the model runs the torch reference
for its results, and the Triton ops run on the same arguments (their Python launch logic unchanged)
with each kernel launch recorded as the key Triton compiles by (constexprs and launch options, and
per runtime argument: integers == 1 / % 16 / 32-bit, pointers 16-byte aligned). The SM counts are
set to the H200's, which decides the attention's split counts.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from gossamer.engine.args import add_engine_arguments, engine_config_from_args
from gossamer.engine.core import EngineConfig, EngineCore
from gossamer.model.loader import load_model
from gossamer.ops.torch_ref import TorchOps
from gossamer.runner import model_runner, warmup
from gossamer.runner.model_runner import ModelRunner, SeqInput
from gossamer.runner.warmup import MoEShape, WarmupStep, warm_up, warmup_plan
from gossamer.sampling_params import SamplingParams
from tests.hf_models import write_hf_model

# NOTE: the kernel modules are imported in the mode tests/kernels/conftest.py gives this machine
# (interpreted without a GPU): the interpreted kernels of those tests share helper modules with
# these, and cannot call compiled helpers.
with pytest.MonkeyPatch.context() as _patch:
    if not torch.cuda.is_available():
        _patch.setenv("TRITON_INTERPRET", "1")
    from gossamer.kernels import attention, embed, gemv, moe_grouped_gemv, moe_mxfp4, norm, rope
    from gossamer.ops.triton import TritonOps

H200_SMS = 132
BLOCK_SIZE = 16
MAX_MODEL_LEN = 4096  # the split ladder reaches MAX_SPLITS (64 splits from 4033 keys)
BUDGET = 256  # max_num_batched_tokens
MAX_SEQS = 8


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    # gpt-oss's 128-token window (sliding layers then split too); dummy MXFP4 experts (4 of them,
    # top 2), so the MoE has its GEMV path up to 4 tokens, grouped BLOCK_M 16 to 32, then 32
    path = write_hf_model(tmp_path_factory.mktemp("warmup"), seed=5, sliding_window=128)
    return load_model(str(path), load_format="dummy", dtype="float32").model


def make_runner(model, **options) -> ModelRunner:
    options = {"num_blocks": 260, "block_size": BLOCK_SIZE, "max_num_seqs": MAX_SEQS,
               "max_num_batched_tokens": BUDGET, "cuda_graphs": False, "warmup": False} | options  # fmt: skip
    return ModelRunner(model, **options)


# ---- recording Triton launches --------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """One kernel launch as Triton keys its compiled binaries."""

    kernel: str
    constexprs: tuple[tuple[str, object], ...]  # and the launch options (num_warps, ...)
    runtime: tuple[tuple[str, tuple], ...]  # per runtime argument, its specialization

    def constexpr(self, name: str) -> object:
        return dict(self.constexprs)[name]

    def arg(self, name: str) -> tuple:
        return dict(self.runtime)[name]


def specialization(value: object) -> tuple:
    if isinstance(value, torch.Tensor):
        return ("pointer", str(value.dtype), value.data_ptr() % 16 == 0)
    if isinstance(value, bool):
        return ("i1",)
    if isinstance(value, int):
        return ("int", value == 1, value % 16 == 0, -(2**31) <= value < 2**31)
    if isinstance(value, float):
        return ("fp32",)
    return (repr(value),)


class KernelRecorder:
    """Stands in for a @triton.jit kernel: `kernel[grid](...)` records a Launch."""

    def __init__(self, kernel, log: list[Launch]) -> None:
        self.name = kernel.fn.__name__
        params = inspect.signature(kernel.fn).parameters.values()
        self.names = [param.name for param in params]
        self.runtime = {p.name for p in params if "constexpr" not in str(p.annotation)}
        # integers Triton does not specialize (do_not_specialize: names or positions; the
        # interpreter keeps the decorator's arguments in `kwargs`)
        options = getattr(kernel, "kwargs", None) or {}
        plain = getattr(kernel, "do_not_specialize", None) or options.get("do_not_specialize")
        self.plain = {self.names[p] if isinstance(p, int) else p for p in plain or ()}
        self.log = log

    def __getitem__(self, grid):
        return self.launch

    def launch(self, *args, **kwargs) -> None:
        values = dict(zip(self.names, args, strict=False)) | kwargs
        constexprs = tuple(sorted((k, v) for k, v in values.items() if k not in self.runtime))
        runtime = tuple((k, ("int", -(2**31) <= v < 2**31) if k in self.plain else specialization(v))
                        for k, v in values.items() if k in self.runtime)  # fmt: skip
        self.log.append(Launch(self.name, constexprs, runtime))
        if self.name == "_route_kernel":
            values["ids_ptr"].zero_()  # valid expert ids: the sort after routing indexes with them


class RecordingOps(TorchOps):
    """The torch reference's results, after the Triton ops ran on the same arguments (with the
    kernels recorded, not run; their outputs are dropped)."""

    name = "triton"

    def __init__(self) -> None:
        super().__init__()
        self.triton = TritonOps()
        self.reference = TorchOps()  # its composite ops (norm_linear) must not record twice


def _recorded(op_name: str):
    def op(self, *args, **kwargs):
        getattr(self.triton, op_name)(*args, **kwargs)
        return getattr(self.reference, op_name)(*args, **kwargs)

    return op


OPS = ("embed", "linear", "rms_norm", "norm_linear", "rope", "write_kv", "rope_and_write_kv",
       "attention", "moe", "norm_moe")  # fmt: skip
for _op in OPS:
    setattr(RecordingOps, _op, _recorded(_op))


def record_launches(patch: pytest.MonkeyPatch, modules, log: list[Launch]) -> None:
    """Replace every @triton.jit function of `modules` by a recorder writing to `log`."""
    for kernels in modules:
        for name, value in vars(kernels).items():
            if hasattr(value, "fn") and hasattr(value, "run"):
                patch.setattr(kernels, name, KernelRecorder(value, log))


@contextlib.contextmanager
def recording(model, gemv_max_m: int | None = None):
    """The model on RecordingOps with H200 SM counts; yields the launch log."""
    log: list[Launch] = []
    modules = [module for module in model.modules() if hasattr(module, "ops")]
    saved = [module.ops for module in modules]
    with pytest.MonkeyPatch.context() as patch:
        if gemv_max_m is not None:
            patch.setattr(gemv, "GEMV_MAX_M", gemv_max_m)
        kernel_modules = (attention, moe_mxfp4, moe_grouped_gemv, gemv, norm, rope, embed)
        record_launches(patch, kernel_modules, log)
        patch.setattr(attention, "_sm_count", lambda device: H200_SMS)
        patch.setattr(gemv, "_num_sms", lambda device: H200_SMS)
        ops = RecordingOps()
        for module in modules:
            module.ops = ops
        try:
            yield log
        finally:
            for module, old in zip(modules, saved, strict=True):
                module.ops = old


# ---- what serving launches later --------------------------------------------------------------

CONTEXTS = (17, 64, 65, 100, 128, 129, 193, 300, 449, 700, 961, 1500, 1985, 3000, 4033, 4096)


def table(context: int) -> tuple[list[int], list[int]]:
    blocks = list(range(1, -(-context // BLOCK_SIZE) + 1))  # shared by all: only shapes matter
    return blocks, blocks


def seq(query_len: int, context: int, num_logits: int = 1) -> SeqInput:
    return SeqInput([5] * query_len, context - query_len, table(context), num_logits)


def serving_steps() -> list[list[SeqInput]]:
    """Steps a server runs: prefill tails after prefix hits (1..8 tokens, any context), decode
    and verification batches, prompt chunks alone and mixed with decodes."""
    rng = np.random.default_rng(0)
    steps = [[seq(q, context)] for q in range(1, 9) for context in (q, *CONTEXTS)]
    for num_seqs in (2, 3, 5, 8, 8):
        lens = rng.integers(1, 9, num_seqs).tolist()
        contexts = rng.choice(CONTEXTS, num_seqs).tolist()
        steps.append([seq(q, c, q) for q, c in zip(lens, contexts, strict=True)])
        steps.append([seq(1, c) for c in contexts])  # plain decode
    for num_tokens in (9, 12, 16, 17, 31, 32, 33, 34, 64, 100, 128, 200, BUDGET):
        steps.append([seq(num_tokens, num_tokens)])
    steps.append([seq(40, 1040)])  # a prefix hit leaving a long tail
    steps.append([seq(20, 20), seq(1, 300), seq(1, 4000), seq(3, 50, 3)])  # chunk + decodes
    return steps


@dataclass
class Recorded:
    steps: list[WarmupStep]
    per_step: list[set[Launch]]  # the launches of each warm-up step
    serving: set[Launch]  # the launches of serving_steps()

    @property
    def warm(self) -> set[Launch]:
        return set().union(*self.per_step)


@pytest.fixture(scope="module")
def recorded(model) -> Recorded:
    """Warm-up and then serving."""
    return record(model)


def record(model, **patches) -> Recorded:
    """The warm-up's launches step by step, then serving_steps()'s (`recording`'s patches)."""
    runner = make_runner(model)
    per_step: list[set[Launch]] = []
    with recording(model, **patches) as log:
        real_dry_run = runner.dry_run

        def dry_run(seqs: list[SeqInput]) -> None:
            log.clear()
            real_dry_run(seqs)
            per_step.append(set(log))

        runner.dry_run = dry_run
        steps = warm_up(runner, progress=False)
        log.clear()
        for step in serving_steps():
            runner.run(step)
        serving = set(log)
    return Recorded(steps, per_step, serving)


def describe(launches: set[Launch]) -> str:
    return "\n".join(sorted(map(str, launches)))


# ---- tests --------------------------------------------------------------------------------------


EXPERTS, TOP_K = 4, 2  # the model fixture's MoE


def moe_tokens(path: str) -> list[int]:
    """The token counts up to the budget whose MoE takes `path` ("grouped_gemv" or "grouped") in
    the model fixture, by moe_mxfp4.moe_mxfp4's pair limits."""
    decode = min(moe_mxfp4.DECODE_MAX_PAIRS, moe_mxfp4.DECODE_PAIRS_PER_EXPERT * EXPERTS)
    grouped_gemv = max(decode, moe_mxfp4.GROUPED_GEMV_MAX_PAIRS)
    low, high = (decode, grouped_gemv) if path == "grouped_gemv" else (grouped_gemv, BUDGET * TOP_K)
    return [tokens for tokens in range(1, BUDGET + 1) if low < tokens * TOP_K <= high]


def test_warm_up_runs_its_plan_once_per_step(recorded):
    assert len(recorded.per_step) == len(recorded.steps)
    # 4 BLOCK_Q buckets x (a short context + 6 split counts), then prefill steps of 9 tokens (the
    # prefill attention), the first count at grouped BLOCK_M 32 (33 * 2 pairs over 4 experts, or
    # the first count past the grouped GEMV's limit: smaller counts are covered by 8 tokens), the
    # first count of each size of the schedule's sort and of each larger M-tile, and the budget
    decode = [step for step in recorded.steps if step.num_tokens <= 8]
    assert sorted({step.query_lens[0] for step in decode}) == [1, 2, 4, 8]
    assert len(decode) == 4 * 7
    first_32 = next(
        t for t in moe_tokens("grouped") if moe_mxfp4._block_m(t * TOP_K, EXPERTS) == 32
    )
    rest = [step.num_tokens for step in recorded.steps[len(decode) :]]
    assert rest[0] == 9 and rest[-1] == BUDGET and first_32 in rest
    sort_size = lambda tokens: moe_grouped_gemv.schedule_sort_size(tokens * TOP_K)  # noqa: E731
    sort_firsts = {t for t in range(10, BUDGET) if sort_size(t) != sort_size(t - 1)}
    # and each later change of the grouped path's M-tile (GROUPED_V2: 64 rows from 255 tokens)
    pick = moe_mxfp4._v2_block_m if moe_mxfp4.GROUPED_V2 else moe_mxfp4._block_m
    grouped = moe_tokens("grouped")
    tile_firsts = {
        t for t in grouped[1:] if pick(t * TOP_K, EXPERTS) != pick((t - 1) * TOP_K, EXPERTS)
    }
    # sorts of 64..512 from 17, 33, 65, 129; and each change of the linear's launches (this
    # model's projections are router-sized: Triton to 64 rows, BLOCK_M 16 / 32 / 64, M % 16)
    first_of_key: dict[tuple, int] = {}
    for t in range(1, BUDGET + 1):
        first_of_key.setdefault(gemv.launch_key(t), t)
    gemv_firsts = {t for t in first_of_key.values() if t >= 10}
    assert gemv_firsts == {16, 17, 32, 33, 48, 65}
    assert set(rest[1:-1]) == sort_firsts | {first_32} | (tile_firsts - {BUDGET}) | gemv_firsts


def test_every_later_launch_was_compiled_by_the_warm_up(recorded):
    missing = recorded.serving - recorded.warm
    assert not missing, f"serving launches the warm-up missed:\n{describe(missing)}"


def constexprs(launches: set[Launch], kernel: str, *names: str, **where: object) -> set[tuple]:
    """The values of the constexprs `names` in the launches of `kernel` that match `where`."""
    return {
        tuple(launch.constexpr(name) for name in names)
        for launch in launches
        if launch.kernel == kernel and all(launch.constexpr(k) == v for k, v in where.items())
    }


ATTENTION = "_paged_attention_kernel"
DECODE_WARPS, PREFILL_WARPS = 4, 8  # how attention.paged_attention launches the two shapes


def test_decode_attention_buckets_with_and_without_splits(recorded):
    buckets = constexprs(recorded.warm, ATTENTION, "BLOCK_Q", "SLIDING", "SPLIT",
                         num_warps=DECODE_WARPS)  # fmt: skip
    assert buckets == {(q, sliding, split) for q in (1, 2, 4, 8) for sliding in (False, True)
                       for split in (False, True)}  # fmt: skip
    # full-attention layers: split counts that are multiples of 16 (16..64) and that are not (2..8)
    split_classes = {
        (launch.constexpr("BLOCK_Q"), launch.arg("num_splits")[2])
        for launch in recorded.warm
        if launch.kernel == ATTENTION
        and launch.constexpr("num_warps") == DECODE_WARPS
        and launch.constexpr("SPLIT")
        and not launch.constexpr("SLIDING")
    }
    assert split_classes == {(q, div16) for q in (1, 2, 4, 8) for div16 in (False, True)}
    merges = constexprs(recorded.warm, ATTENTION, "SPLITS_P2", MERGE=True)  # merged in-kernel
    assert merges == {(2,), (4,), (8,), (16,), (32,), (64,)}


def test_prefill_attention_and_moe_paths(recorded):
    prefill = constexprs(recorded.warm, ATTENTION, "SLIDING", "SPLIT", num_warps=PREFILL_WARPS)
    assert prefill == {(False, False), (True, False)}
    assert constexprs(recorded.warm, "_fp16_gate_up_kernel")  # the GEMV path
    block_ms = constexprs(recorded.warm, "_grouped_gate_up_kernel", "BLOCK_M")
    block_ms |= constexprs(recorded.warm, "_v2_gate_up_kernel", "BLOCK_M")  # GROUPED_V2
    # {32} with the grouped GEMV up to 64 tokens (M-tiles of 4 pairs: 4 experts)
    pick = moe_mxfp4._v2_block_m if moe_mxfp4.GROUPED_V2 else moe_mxfp4._block_m
    assert block_ms == {(pick(t * TOP_K, EXPERTS),) for t in moe_tokens("grouped")}
    tiles = constexprs(recorded.warm, "_gemv_gate_up_kernel", "BLOCK_M")  # the grouped GEMV's
    assert tiles == {(moe_grouped_gemv.default_block_m(t * TOP_K, EXPERTS),)
                     for t in moe_tokens("grouped_gemv")}  # fmt: skip
    # this model's projections are all router-sized: at M == 1 the FMA kernel on whole rows
    assert constexprs(recorded.warm, "_gemv_dot_kernel", "BLOCK_M") == ROW_CLASSES - {(1,)}
    wide_tile = constexprs(recorded.warm, "_gemv_dot_kernel", "BLOCK_N", "num_warps", BLOCK_M=64)
    assert wide_tile == {
        (gemv.CONFIGS["narrow_wide"].block_n, gemv.CONFIGS["narrow_wide"].num_warps)
    }
    assert constexprs(recorded.warm, "_gemv_fma_kernel", "BLOCK_N", "SPLIT") == {(1, 0)}


# 1, 2, 4, ... to the most rows the router-sized projections take the Triton GEMV (64)
ROW_CLASSES = {(1 << i,) for i in range(gemv.max_rows("narrow").bit_length())}


def test_triton_linears_up_to_64_rows_are_warmed_up(model):
    """With the Triton GEMV serving every class up to 64 rows (GOSSAMER_GEMV_MAX_M=64; by default
    only the router-sized ones, gemv.CLASS_MAX_M, which are all this model has), the warm-up
    still compiles every launch serving makes: BLOCK_M 16, 32 and 64, the wide config from
    gemv.WIDE_FROM rows, and row counts that are multiples of 16."""
    wide = record(model, gemv_max_m=64)
    missing = wide.serving - wide.warm
    assert not missing, f"serving launches the warm-up missed:\n{describe(missing)}"
    tiles = constexprs(wide.warm, "_gemv_dot_kernel", "BLOCK_M", "BLOCK_N")
    assert {m for m, _ in tiles} == {2, 4, 8, 16, 32, 64}
    narrow_wide = gemv.CONFIGS["narrow_wide"].block_n  # this model's projections are router-sized
    assert {m for m, n in tiles if n == narrow_wide} >= {32, 64}
    rows = {launch.arg("M")[2] for launch in wide.warm if launch.kernel == "_gemv_dot_kernel"}
    assert rows == {False, True}  # M % 16 == 0 at 16, 32, 48, 64 rows, and not elsewhere
    assert {16, 17, 32, 33, 48} <= {step.num_tokens for step in wide.steps}


PLAN_HOLES = {
    "BLOCK_Q 4 steps": lambda step: step.query_lens == (4,),
    "BLOCK_Q 2 steps": lambda step: step.query_lens == (2,),
    "split contexts": lambda step: step.start > 0,
    "contexts of 16+ splits": lambda step: step.start + step.num_tokens >= 961,
    "contexts of 8 splits": lambda step: 449 <= step.start + step.num_tokens < 961,
    "prefill steps": lambda step: step.num_tokens > 8,
    "the MoE BLOCK_M 32 steps": lambda step: step.num_tokens >= 33,
    "the linear's 16-row multiples": lambda step: step.num_tokens in (16, 32, 48),
}


@pytest.mark.parametrize("hole", sorted(PLAN_HOLES))
def test_a_plan_with_a_hole_misses_later_launches(recorded, hole):
    """The check above is sharp: without any one group of steps, serving launches something new."""
    dropped = PLAN_HOLES[hole]
    kept = [keys for step, keys in zip(recorded.steps, recorded.per_step, strict=True)
            if not dropped(step)]  # fmt: skip
    assert len(kept) < len(recorded.steps)
    assert recorded.serving - set().union(*kept)


def moe_launches(num_experts: int, top_k: int):
    """token count -> the launches of moe_mxfp4.moe_mxfp4 on MXFP4 experts of that routing
    (tiny hidden sizes: the path and tile choices depend on the token and expert counts)."""
    from tests.kernels.test_moe_mxfp4 import ALPHA, LIMIT, _experts

    experts = _experts(num_experts, 64, 32, seed=0, device="cpu")  # kernels recorded, not run
    log: list[Launch] = []

    def launches(num_tokens: int) -> set[Launch]:
        log.clear()
        x, logits = torch.zeros(num_tokens, 64), torch.zeros(num_tokens, num_experts)
        moe_mxfp4.moe_mxfp4(x, logits, experts, top_k, LIMIT, ALPHA)
        return set(log)

    return launches, log


@pytest.mark.parametrize("num_experts", [128, 32])  # gpt-oss-120b and 20b, top-4
def test_plan_reaches_every_moe_launch_of_the_gpt_oss_routings(num_experts):
    """The plan's token counts reach every MoE launch (path, BLOCK_M, integer classes) that any
    batch up to the budget makes, with 128 or 32 experts (the model fixture has 4): the plan's
    view of the MoE paths (warmup.moe_launch_shape) must follow moe_mxfp4's choice."""
    budget = 4096  # past grouped v2's last BLOCK_M change (64 from 64 pairs an expert)
    plan = warmup_plan(4096, budget, 256, MoEShape(num_experts, 4, mxfp4=True))
    with pytest.MonkeyPatch.context() as patch:
        launches, log = moe_launches(num_experts, 4)
        record_launches(patch, (moe_mxfp4, moe_grouped_gemv), log)
        warm = set().union(*(launches(count) for count in {step.num_tokens for step in plan}))
        missing = {}
        for count in range(1, budget + 1):
            for launch in launches(count) - warm:
                missing.setdefault(launch, count)
    assert not missing, "\n".join(f"{count} tokens: {launch}" for launch, count in missing.items())


def test_dry_run_writes_no_kv_and_returns_nothing(model):
    runner = make_runner(model)
    runner.kv_cache.normal_()
    before = runner.kv_cache.clone()
    steps = warm_up(runner, progress=False)
    # 28 decode steps; 9, 16, 17, 32, 33, 48, 65, 127 (64-row tiles), 129 and 256
    assert len(steps) == 38
    assert torch.equal(runner.kv_cache, before)


def test_runner_warms_up_only_when_asked_with_triton_on_the_gpu(model, monkeypatch):
    calls = []
    monkeypatch.setattr(warmup, "warm_up", lambda runner: calls.append(runner))
    make_runner(model, warmup=True)  # CPU, torch ops
    monkeypatch.setattr(model_runner, "triton_on_gpu", lambda model: True)
    make_runner(model, warmup=False)
    assert calls == []
    runner = make_runner(model, warmup=True)
    assert calls == [runner]


def test_no_warmup_flag():
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert engine_config_from_args(parser.parse_args([])).warmup
    assert not engine_config_from_args(parser.parse_args(["--no-warmup"])).warmup


def generate(engine: EngineCore, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    tokens: dict[str, list[int]] = {}
    for i, prompt in enumerate(prompts):  # one at a time: later prompts hit the cached prefix
        engine.add_request(str(i), prompt, params)
        tokens[str(i)] = []
        while engine.has_unfinished_requests():
            for out in engine.step():
                tokens[out.request_id] += out.new_token_ids
    return list(tokens.values())


def test_engine_after_warm_up_holds_no_blocks_and_generates_the_same_tokens(model, monkeypatch):
    monkeypatch.setattr(model_runner, "triton_on_gpu", lambda model: True)  # force the warm-up
    calls = []
    monkeypatch.setattr(warmup, "warm_up", lambda runner: calls.append(warm_up(runner, False)))
    options = {"block_size": BLOCK_SIZE, "num_blocks": 64, "max_num_seqs": 4,
               "max_num_batched_tokens": 64, "cuda_graphs": False}  # fmt: skip
    warmed = EngineCore(model, None, EngineConfig(warmup=True, **options))
    assert len(calls) == 1
    assert not warmed.runner.kv_cache.any()  # allocated as zeros, nothing written
    manager = warmed.kv_cache_manager
    assert manager.num_free_blocks == manager.pool.num_usable_blocks
    assert manager.pool.num_cached_blocks == 0
    manager.pool.check_invariants()
    cold = EngineCore(model, None, EngineConfig(warmup=False, **options))
    assert len(calls) == 1
    shared = list(range(10, 50))
    prompts = [shared, shared + [7, 8], shared + [9, 10, 11, 12, 13], [3, 1, 4, 1, 5]]
    assert generate(warmed, prompts) == generate(cold, prompts)
