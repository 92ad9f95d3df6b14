"""The runner's flat mixed batches give the same logits as one sequence at a time."""

from __future__ import annotations

import torch

from gossamer.engine.reference import ContiguousCache, forward_tokens
from gossamer.model.loader import load_model
from gossamer.runner.model_runner import ModelRunner, SeqInput
from tests.hf_models import write_hf_model


def test_mixed_prefill_chunks_and_decodes_match_single_sequence_runs(tmp_path):
    model = load_model(str(write_hf_model(tmp_path, seed=21)), dtype="float32").model
    runner = ModelRunner(
        model, num_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=64
    )
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 320, (n,), generator=gen).tolist() for n in (13, 6, 22)]
    # disjoint block ranges per sequence and group; 8 blocks of 4 hold 32 positions
    tables = [
        (list(range(1 + 16 * i, 9 + 16 * i)), list(range(9 + 16 * i, 17 + 16 * i)))
        for i in range(3)
    ]
    # step 1: seq0 whole prompt, seq1 first 4 tokens (no logits), seq2 first 10
    step1 = [
        SeqInput(prompts[0], 0, tables[0]),
        SeqInput(prompts[1][:4], 0, tables[1], 0),
        SeqInput(prompts[2][:10], 0, tables[2], num_logits=3),
    ]
    logits1 = runner.run(step1)
    # step 2: seq0 decodes one token, seq1 finishes its prompt, seq2 continues its prompt
    step2 = [
        SeqInput([7], 13, tables[0]),
        SeqInput(prompts[1][4:], 4, tables[1]),
        SeqInput(prompts[2][10:], 10, tables[2]),
    ]
    logits2 = runner.run(step2)

    def reference(tokens):
        return forward_tokens(model, ContiguousCache(model, len(tokens)), tokens, 0)

    ref0, ref1, ref2 = reference(prompts[0] + [7]), reference(prompts[1]), reference(prompts[2])
    torch.testing.assert_close(logits1[0], ref0[12], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(logits1[1:4], ref2[7:10], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(logits2[0], ref0[13], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(logits2[1], ref1[5], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(logits2[2], ref2[21], rtol=1e-4, atol=1e-5)
