"""EAGLE-3: the target's auxiliary hidden states against transformers, the head against an
independent reference (transformers' Llama rotary and RMSNorm), checkpoint loading, and exact greedy
outputs in the engine."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from gossamer.engine.reference import ContiguousCache
from gossamer.sampling_params import SamplingParams
from gossamer.spec.config import SpecConfig, parse_spec_config
from gossamer.spec.eagle3 import Eagle3Error, load_eagle3_head, paged_metadata
from tests.hf_models import load_hf_model
from tests.spec.checkpoints import write_eagle3_checkpoint
from tests.spec.conftest import make_engine, repetitive_prompts, run_engine

AUX = (0, 1, 2)


def test_aux_hidden_states_are_the_residual_stream_entering_each_layer(target3, target3_path):
    hf = load_hf_model(target3_path)
    prompt = repetitive_prompts(1, seed=1)[0]
    with torch.no_grad():
        expected = hf(torch.tensor([prompt]), output_hidden_states=True).hidden_states
    cache = ContiguousCache(target3, len(prompt))
    ids = torch.tensor(prompt)
    positions = torch.arange(len(prompt))
    metadata = cache.metadata(0, len(prompt))
    with torch.inference_mode():
        plain = target3(ids, positions, metadata, cache.kv_cache)
        hidden, aux = target3(ids, positions, metadata, cache.kv_cache, aux_layers=(2, 0))
    torch.testing.assert_close(hidden, plain)
    assert len(aux) == 2
    torch.testing.assert_close(aux[0], expected[0][0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(aux[1], expected[2][0], rtol=1e-4, atol=1e-5)


def reference_head(tensors, config, embedding, token_ids, aux):
    """The EAGLE-3 layer on a whole sequence, written from the published description with
    transformers' Llama rotary embedding and RMSNorm."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import (
        LlamaRMSNorm,
        LlamaRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    def norm(name, x):
        module = LlamaRMSNorm(x.shape[-1], eps=1e-5)
        module.weight.data = tensors[name + ".weight"]
        return module(x)

    def linear(name, x):
        return x @ tensors[name + ".weight"].T

    heads, kv_heads, dim = 4, 2, 16
    embeds = norm("midlayer.input_layernorm", embedding[token_ids])
    projected = linear("fc", aux)
    normed_hidden = norm("midlayer.hidden_norm", projected)
    residual = normed_hidden if config["norm_before_residual"] else projected
    x = torch.cat((embeds, normed_hidden), dim=-1)
    n = len(token_ids)
    q = linear("midlayer.self_attn.q_proj", x).view(1, n, heads, dim).transpose(1, 2)
    k = linear("midlayer.self_attn.k_proj", x).view(1, n, kv_heads, dim).transpose(1, 2)
    v = linear("midlayer.self_attn.v_proj", x).view(1, n, kv_heads, dim).transpose(1, 2)
    rope_config = LlamaConfig(
        hidden_size=config["hidden_size"],
        num_attention_heads=heads,
        head_dim=dim,
        rope_theta=config["rope_theta"],
        rope_scaling=config["rope_scaling"],
    )
    cos, sin = LlamaRotaryEmbedding(rope_config)(v, torch.arange(n)[None])
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    scores = (q @ k.transpose(-1, -2)) * dim**-0.5
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(n, heads * dim)
    hidden = linear("midlayer.self_attn.o_proj", attn) + residual
    x = norm("midlayer.post_attention_layernorm", hidden)
    mlp = linear(
        "midlayer.mlp.down_proj",
        torch.nn.functional.silu(linear("midlayer.mlp.gate_proj", x))
        * linear("midlayer.mlp.up_proj", x),
    )
    final = mlp + hidden
    return norm("norm", final), final


@pytest.mark.parametrize(
    "variant",
    [
        {},
        {"norm_before_residual": True, "own_embedding": True, "prefix": "model."},
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8,
            }
        },
    ],
)
def test_head_matches_the_reference_through_the_paged_cache(target3, tmp_path, variant):
    draft_vocab = [5, 17, 40, 41, 300]
    path = write_eagle3_checkpoint(
        tmp_path / "eagle",
        vocab_size=320,
        target_hidden_size=64,
        aux_layer_ids=AUX,
        draft_vocab=draft_vocab,
        seed=2,
        **variant,
    )
    head = load_eagle3_head(path, target3)
    tensors = {
        name.removeprefix("model."): t for name, t in load_file(path / "model.safetensors").items()
    }
    embedding = tensors.get("embed_tokens.weight", target3.model.embed_tokens.weight)
    import json

    config = json.loads((path / "config.json").read_text())
    gen = torch.Generator().manual_seed(0)
    token_ids = torch.randint(0, 320, (11,), generator=gen)
    aux = torch.randn(11, 3 * 64, generator=gen)
    want_normed, want_prenorm = reference_head(tensors, config, embedding, token_ids, aux)
    # the head in two chunks (7 then 4 positions) over a paged cache with block size 4
    kv_cache = head.allocate_kv_cache(8, 4)
    table = [3, 1, 6, 2]
    got = []
    with torch.inference_mode():
        for start, end in ((0, 7), (7, 11)):
            metadata = paged_metadata([(start, end - start, table)], 4, kv_cache.device)
            got.append(
                head(
                    token_ids[start:end],
                    torch.arange(start, end),
                    aux[start:end],
                    metadata,
                    kv_cache,
                )
            )
    normed = torch.cat([g[0] for g in got])
    prenorm = torch.cat([g[1] for g in got])
    torch.testing.assert_close(prenorm, want_prenorm, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(normed, want_normed, rtol=1e-4, atol=1e-4)
    logits = head.compute_logits(normed)
    assert logits.shape == (11, 320)
    torch.testing.assert_close(
        logits[:, draft_vocab], normed @ tensors["lm_head.weight"].T, rtol=1e-4, atol=1e-4
    )
    outside = [t for t in range(320) if t not in draft_vocab]
    assert torch.isinf(logits[:, outside]).all()


def test_loading_errors_say_what_is_wrong(target3, tmp_path):
    path = write_eagle3_checkpoint(
        tmp_path / "wrong", vocab_size=320, target_hidden_size=32, aux_layer_ids=AUX
    )
    with pytest.raises(Eagle3Error, match="target hidden size"):
        load_eagle3_head(path, target3)
    reduced = write_eagle3_checkpoint(
        tmp_path / "reduced",
        vocab_size=320,
        target_hidden_size=64,
        aux_layer_ids=AUX,
        draft_vocab=[1, 2],
    )
    tensors = load_file(reduced / "model.safetensors")
    del tensors["d2t"]
    from safetensors.torch import save_file

    save_file(tensors, reduced / "model.safetensors")
    with pytest.raises(Eagle3Error, match="d2t"):
        load_eagle3_head(reduced, target3)
    assert parse_spec_config({"method": "auto", "model": str(path)}).proposer_methods == (
        "ngram",
        "suffix",
        "eagle3",
    )


def requests_keys(requests):
    return [(request_id, 0) for request_id in requests]


@pytest.mark.parametrize("tree", [None, {"branching": [3, 2, 1]}], ids=["chain", "tree"])
def test_greedy_with_eagle3_equals_plain_decoding(tree, target3, tmp_path):
    prompts = repetitive_prompts(5, seed=21)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    requests = {str(i): (p, params) for i, p in enumerate(prompts)}
    # arrives after the others: hits their cached blocks, which the head never saw computed
    later = {"hit": (prompts[0] * 2 + prompts[1], params)}
    plain, _, _ = run_engine(make_engine(target3, None), requests | later)
    common = Counter(t for tokens in plain.values() for t in tokens).most_common(1)[0][0]
    heads = {
        "random": write_eagle3_checkpoint(
            tmp_path / "random", vocab_size=320, target_hidden_size=64, aux_layer_ids=AUX, seed=3
        ),
        # a zero final norm: every draft is draft id 0, i.e. the output's most common token
        "constant": write_eagle3_checkpoint(
            tmp_path / "constant",
            vocab_size=320,
            target_hidden_size=64,
            aux_layer_ids=AUX,
            draft_vocab=[common],
            constant_draft=True,
        ),
    }
    for name, path in heads.items():
        spec = SpecConfig(method="eagle3", model=str(path), num_speculative_tokens=3, tree=tree)
        engine = make_engine(target3, spec, max_num_batched_tokens=16, num_blocks=400)
        tokens, _, _ = run_engine(engine, requests)
        tokens |= run_engine(engine, later)[0]
        assert tokens == plain, name
        stats = engine.stats.spec_stats
        assert stats["eagle3_num_draft_tokens"] > 0
        assert stats["num_tree_drafts"] == (stats["eagle3_num_drafts"] if tree else 0)
        assert engine.stats.prefix_cache_hits > 0
        if name == "constant":
            assert stats["num_accepted_tokens"] > 0
        tight = make_engine(target3, spec, num_blocks=40)  # preempts mid-speculation
        assert run_engine(tight, requests)[0] == {k: plain[k] for k in requests_keys(requests)}
        assert tight.stats.num_preemptions > 0
    seeded = SamplingParams(temperature=0.8, seed=4, max_tokens=12, ignore_eos=True)
    spec = replace(spec, model=str(heads["random"]), num_speculative_tokens=2 if not tree else 3)
    runs = [
        run_engine(make_engine(target3, spec), {"s": (prompts[1], seeded)} | extra)[0][("s", 0)]
        for extra in ({}, {"o": (prompts[2], params)})
    ]
    assert runs[0] == runs[1]
    if tree:  # top-k children are point masses: one race draw per token, as plain sampling
        alone = {"s": (prompts[1], seeded)}
        assert runs[0] == run_engine(make_engine(target3, None), alone)[0][("s", 0)]
