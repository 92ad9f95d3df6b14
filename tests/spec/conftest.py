"""Shared fixtures of the speculative decoding tests: tiny float32 targets and one engine driver."""

from __future__ import annotations

import pytest
import torch

from gossamer.engine.core import EngineConfig, EngineCore
from gossamer.model.loader import load_model
from gossamer.sampling_params import SamplingParams
from gossamer.spec.config import SpecConfig
from gossamer.spec.eagle3 import AuxHiddenRunner
from tests.hf_models import write_hf_model


@pytest.fixture(scope="session")
def target_path(tmp_path_factory):
    return write_hf_model(tmp_path_factory.mktemp("target"), seed=31, num_hidden_layers=2)


@pytest.fixture(scope="session")
def target(target_path):
    return load_model(str(target_path), dtype="float32", max_model_len=256).model


@pytest.fixture(scope="session")
def target3_path(tmp_path_factory):
    """A 3-layer target: EAGLE-3 reads three of its layers."""
    return write_hf_model(tmp_path_factory.mktemp("target3"), seed=1)


@pytest.fixture(scope="session")
def target3(target3_path):
    return load_model(str(target3_path), dtype="float32", max_model_len=256).model


@pytest.fixture(scope="session")
def other_model_path(tmp_path_factory):
    """A different random model: a draft the target rarely agrees with."""
    return write_hf_model(tmp_path_factory.mktemp("other"), seed=7, num_hidden_layers=1)


# A cost model in which verifying k drafts costs one decode step: the cost-aware "auto" then
# always speculates as far as its drafts reach (tests of padding and proposer choice).
FREE_VERIFICATION = {"1": [1.0, 1.0]}


GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def greedy_requests(count: int = 6, seed: int = 0, params: SamplingParams = GREEDY) -> dict:
    """Request id -> (a repetitive prompt, params): the workload most spec tests run."""
    return {str(i): (p, params) for i, p in enumerate(repetitive_prompts(count, seed))}


def repetitive_prompts(count: int, seed: int = 0) -> list[list[int]]:
    """Prompts that repeat a short phrase, so that n-gram lookups find matches."""
    gen = torch.Generator().manual_seed(seed)
    prompts = []
    for _ in range(count):
        phrase = torch.randint(
            0, 320, (int(torch.randint(3, 7, (1,), generator=gen)),), generator=gen
        )
        tail = torch.randint(
            0, 320, (int(torch.randint(1, 5, (1,), generator=gen)),), generator=gen
        )
        repeats = int(torch.randint(2, 5, (1,), generator=gen))
        prompts.append(phrase.tolist() * repeats + tail.tolist())
    return prompts


def prefix_sharing_requests() -> dict[str, tuple[list[int], SamplingParams]]:
    """Two requests that share a long prefix and two others: with a small pool, prefix hits and
    preemptions."""
    shared = repetitive_prompts(1, seed=4)[0] * 3
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    return {
        "a": (shared + [5, 6, 7], params),
        "b": (shared + [9, 10], params),
        "c": (repetitive_prompts(1, seed=5)[0], params),
        "d": (repetitive_prompts(1, seed=6)[0], params),
    }


def make_engine(model, spec: SpecConfig | None, runner=None, **options) -> EngineCore:
    """`runner`: the target's ModelRunner, else the engine builds one."""
    config = {"block_size": 4, "num_blocks": 400, "speculative_config": spec} | options
    return EngineCore(model, None, EngineConfig(**config), runner)


def run_engine(engine: EngineCore, requests: dict[str, tuple[list[int], SamplingParams]]):
    """Run to completion; returns ({(id, index): tokens}, {(id, index): logprobs}, steps)."""
    for request_id, (prompt, params) in requests.items():
        engine.add_request(request_id, prompt, params)
    tokens: dict = {}
    logprobs: dict = {}
    steps = 0
    while engine.has_unfinished_requests():
        steps += 1
        for out in engine.step():
            key = (out.request_id, out.index)
            tokens.setdefault(key, []).extend(out.new_token_ids)
            logprobs.setdefault(key, []).extend(out.new_logprobs)
    return tokens, logprobs, steps


def assert_runs_alike(eager, graphed, step) -> None:
    """One step on an eager and a graph-replaying runner (AuxHiddenRunner both): the same logits,
    the same aux rows of the fed tokens, and the same cache (padding wrote no KV)."""
    want = eager.run(step)
    got = graphed.run(step)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(graphed.last_aux_hidden, eager.last_aux_hidden, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(graphed.kv_cache, eager.kv_cache, rtol=1e-5, atol=1e-5)


# ---- runners of the target3 model's EAGLE-3 tests -----------------------------------------------

AUX = (0, 1, 2)  # the EAGLE-3 heads read all three layers of target3


def aux_runner(model, **options) -> AuxHiddenRunner:
    return AuxHiddenRunner(
        model,
        aux_layers=AUX,
        num_blocks=80,
        block_size=4,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        **options,
    )


def tables(runner, seq: int) -> tuple[list[int], ...]:
    """Distinct blocks per sequence and cache group (block 0 is the null block)."""
    groups = runner.num_groups
    return tuple([1 + 10 * (groups * seq + g) + i for i in range(10)] for g in range(groups))
