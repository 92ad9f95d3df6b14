"""EAGLE-3 through captured graphs, tested on the CPU: EagerGraphCapture stands in for CUDA graphs
(a "replay" runs the captured step function again on the same persistent buffers), so the graph code
path itself runs: the graph keys, the buffers and their padding rows, the outputs sliced back out.
The GPU twins that capture for real are in test_spec_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gossamer.runner.model_runner import GRAPH, EagerGraphCapture, SeqInput
from gossamer.sampling_params import SamplingParams
from gossamer.spec.config import SpecConfig
from gossamer.spec.eagle3 import ChainInput, DraftChainGraphs, load_eagle3_head
from tests.spec.checkpoints import write_eagle3_checkpoint
from tests.spec.conftest import (
    AUX,
    assert_runs_alike,
    aux_runner,
    make_engine,
    repetitive_prompts,
    run_engine,
    tables,
)

SIZES = [1, 2, 4, 8]
GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


@pytest.fixture(scope="module")
def head_path(tmp_path_factory, target3):
    """A head that agrees with the target often enough that drafts get accepted: its drafts are
    the target's most common output token (a zero final norm)."""
    prompts = repetitive_prompts(1, seed=21)
    plain, _, _ = run_engine(make_engine(target3, None), {"p": (prompts[0], GREEDY)})
    common = max(set(plain[("p", 0)]), key=plain[("p", 0)].count)
    return {
        "random": write_eagle3_checkpoint(
            tmp_path_factory.mktemp("random"),
            vocab_size=320,
            target_hidden_size=64,
            aux_layer_ids=AUX,
            seed=3,
        ),
        "reduced": write_eagle3_checkpoint(
            tmp_path_factory.mktemp("reduced"),
            vocab_size=320,
            target_hidden_size=64,
            aux_layer_ids=AUX,
            draft_vocab=[common, 5, 17, 40, 41],
            seed=4,
        ),
    }


def test_the_target_runner_replays_logits_and_aux_states_of_the_eager_step(target3):
    eager = aux_runner(target3, cuda_graphs=False)
    graphed = aux_runner(target3, cuda_graphs=False)
    graphed.capture_graphs(SIZES, (1, 3), capture=EagerGraphCapture())
    assert set(graphed.graphs) == {(b, q) for b in SIZES for q in (1, 3)}
    assert not eager.graphs
    prompts = repetitive_prompts(3, seed=5)
    prefill = [SeqInput(p, 0, tables(eager, i)) for i, p in enumerate(prompts)]
    # a uniform step of 3 sequences x 3 tokens (verification of 2 drafts): the (4, 3) graph
    verify = [
        SeqInput([7, 8, 9], len(p), tables(eager, i), num_logits=3) for i, p in enumerate(prompts)
    ]
    decode = [SeqInput([4], len(p) + 3, tables(eager, i)) for i, p in enumerate(prompts[:2])]
    for step in (prefill, verify, decode):
        assert_runs_alike(eager, graphed, step)  # padding sequences wrote no KV
    assert graphed.last_aux_hidden.shape == (2, 3 * 64)  # the padding row is left out
    assert graphed.graphs[(4, 3)].num_replays == 1 and graphed.graphs[(2, 1)].num_replays == 1
    assert graphed.step_modes[GRAPH] == 2 and eager.step_modes[GRAPH] == 0
    # the (4, 3) graph's persistent outputs hold every row, the padding sequence's included
    assert graphed.graph_extras[(4, 3)][0].shape == (12, 3 * 64)


def test_chain_buffers_mark_padding_rows_and_unwanted_steps(target3, head_path):
    head = load_eagle3_head(head_path["random"], target3)
    graphs = DraftChainGraphs(head, head.allocate_kv_cache(16, 4), 4, max_batch=4, max_draft_len=3)
    hidden = torch.ones(64)
    chains = [
        ChainInput(hidden, hidden, first_position=9, count=3, block_table=[5, 6, 7]),
        ChainInput(hidden, hidden, first_position=5, count=1, block_table=[3, 2]),
    ]
    graphs._fill(4, chains)
    host = graphs.host
    # chain 0 feeds drafts 0 and 1 at positions 9 and 10 (blocks 7, offsets 1 and 2)
    assert host["positions"][:, 0].tolist() == [9, 10]
    assert host["slot_mapping"][:, 0].tolist() == [7 * 4 + 1, 7 * 4 + 2]
    assert host["seq_lens"][:, 0].tolist() == [10, 11]
    # chain 1 wants one draft: its head steps attend to its true positions and write nothing
    assert host["slot_mapping"][:, 1].tolist() == [-1, -1]
    assert host["seq_lens"][:, 1].tolist() == [5, 5]
    # rows 2 and 3 pad the batch: the null block, nothing written
    assert (host["slot_mapping"][:, 2:4] == -1).all() and (host["block_tables"][2:4, 0] == 0).all()
    assert torch.equal(graphs.normed[:2], torch.ones(2, 64)) and not graphs.normed[2:].any()
    assert np.array_equal(graphs.dev["slot_mapping"][:, :4].numpy(), host["slot_mapping"][:, :4])
    graphs.graphs = {(4, 3): None, (8, 2): None, (8, 3): None, (2, 1): None}
    assert graphs.key_for(2, 3) == (4, 3)
    assert graphs.key_for(2, 1) == (2, 1)
    assert graphs.key_for(5, 2) == (8, 2)
    assert graphs.key_for(9, 1) is None


def graphed_engine(model, spec: SpecConfig, **options):
    engine = make_engine(model, spec, **options)
    query_lens = (1, *(1 + k for k in spec.draft_len_ladder))
    engine.runner.capture_graphs(SIZES, query_lens, capture=EagerGraphCapture())
    proposer = engine.speculator.proposers["eagle3"]
    proposer.capture_graphs(SIZES, spec.draft_len_ladder, capture=EagerGraphCapture())
    return engine, proposer


def record_drafts(proposer) -> list:
    """Wrap propose(): the (request id, draft tokens) of every call."""
    calls = []
    propose = proposer.propose

    def recording(requests):
        drafts = propose(requests)
        calls.append(
            [
                (r.request_id, d.token_ids if d else None)
                for r, d in zip(requests, drafts, strict=True)
            ]
        )
        return drafts

    proposer.propose = recording
    return calls


def run_with_a_late_arrival(engine, requests, late) -> dict:
    """Like run_engine; `late` arrives after three steps, while the others decode."""
    tokens: dict = {}

    def step() -> None:
        for out in engine.step():
            tokens.setdefault((out.request_id, out.index), []).extend(out.new_token_ids)

    for request_id, (prompt, params) in requests.items():
        engine.add_request(request_id, prompt, params)
    for _ in range(3):
        step()
    for request_id, (prompt, params) in late.items():
        engine.add_request(request_id, prompt, params)
    while engine.has_unfinished_requests():
        step()
    return tokens


@pytest.mark.parametrize("head", ["random", "reduced"])
def test_greedy_eagle3_through_graphs_equals_the_eager_path_and_plain_decoding(
    target3, head_path, head
):
    """Mixed batches: prompts arrive while others decode (eager prefill steps beside replayed
    verification steps), drafts of different lengths near max_tokens, a seeded random request."""
    prompts = repetitive_prompts(6, seed=8)
    requests = {str(i): (p, GREEDY) for i, p in enumerate(prompts[:4])}
    requests["short"] = (prompts[4], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    late = {"late": (prompts[5] * 3, GREEDY)}
    seeded = {"s": (prompts[1], SamplingParams(temperature=0.8, seed=3, max_tokens=10))}
    plain = run_engine(make_engine(target3, None), requests | late)[0]
    spec = SpecConfig(method="eagle3", model=str(head_path[head]), num_speculative_tokens=3)
    runs = {}
    for name in ("eager", "graphs"):
        if name == "eager":
            engine = make_engine(target3, spec, max_num_batched_tokens=40)
            proposer = engine.speculator.proposers["eagle3"]
        else:
            engine, proposer = graphed_engine(target3, spec, max_num_batched_tokens=40)
        drafts = record_drafts(proposer)
        tokens = run_with_a_late_arrival(engine, requests, late)
        tokens |= run_engine(engine, seeded)[0]
        runs[name] = (tokens, drafts, engine, proposer)
    (eager_tokens, eager_drafts, eager, eager_proposer) = runs["eager"]
    (tokens, drafts, engine, proposer) = runs["graphs"]
    assert tokens == eager_tokens  # the seeded request's too
    del tokens[("s", 0)]
    assert tokens == plain
    # the very drafts of the eager path, through the captured graphs
    assert drafts == eager_drafts
    assert engine.stats.spec_stats == eager.stats.spec_stats
    assert engine.stats.spec_stats["num_uniform_verify_steps"] > 0
    assert engine.runner.step_modes[GRAPH] > 0 and not eager.runner.step_modes[GRAPH]
    assert engine.runner.step_modes["eager_prefill"] > 0
    assert proposer.draft_modes["graph"] > 0
    assert proposer.draft_modes["eager"] > 0  # the seeded request drafts eagerly
    assert eager_proposer.draft_modes == {"eager": eager_proposer.draft_modes["eager"]}
    if head == "reduced":
        assert engine.stats.spec_stats["num_accepted_tokens"] > 0
    # every draft position the graphs wrote is one the eager path wrote (no padding writes)
    torch.testing.assert_close(proposer.kv_cache, eager_proposer.kv_cache, rtol=1e-5, atol=1e-5)
