"""Workloads: exact prompt lengths with a tokenizer, determinism, prefix/multi-turn shapes,
ShareGPT loading. The tokenizer is a small byte-level BPE trained here on English text."""

from __future__ import annotations

import itertools
import json
import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from gossamer.bench.errors import BenchConfigError
from gossamer.bench.prompts import (
    COMMON_WORDS,
    TokenizerPromptBuilder,
    WordPromptBuilder,
    load_tokenizer,
    make_prompt_builder,
)
from gossamer.bench.workloads import WorkloadSpec, conversations, take_requests


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    rng = random.Random(0)
    words = [w.strip() for w in COMMON_WORDS] + ["serving", "engine", "tokens", "latency"]
    corpus = [" ".join(rng.choice(words) for _ in range(40)) + "." for _ in range(300)]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(corpus, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def texts(stream, count):
    return [(c.system_prompt, [t.text for t in c.turns]) for c in itertools.islice(stream, count)]


def test_random_prompts_have_exact_token_lengths(tokenizer_file):
    reference = Tokenizer.from_file(str(tokenizer_file))  # counted apart from the builder
    builder = make_prompt_builder(str(tokenizer_file.parent))  # a folder works too
    assert builder.exact
    spec = WorkloadSpec(name="random", input_len=37, output_len=9)
    for conversation in itertools.islice(conversations(spec, builder, seed=1), 20):
        (turn,) = conversation.turns
        assert len(reference.encode(turn.text, add_special_tokens=False).ids) == 37
        assert turn.num_tokens == 37 and turn.max_output_tokens == 9


def test_range_ratio_spreads_lengths_inside_bounds(tokenizer_file):
    builder = TokenizerPromptBuilder(load_tokenizer(tokenizer_file))
    spec = WorkloadSpec(name="random", input_len=20, output_len=10, range_ratio=0.5)
    turns = [c.turns[0] for c in itertools.islice(conversations(spec, builder, seed=3), 40)]
    assert all(10 <= t.num_tokens <= 30 and 5 <= t.max_output_tokens <= 15 for t in turns)
    assert len({t.num_tokens for t in turns}) > 5
    assert all(builder.count(t.text) == t.num_tokens for t in turns)


def test_without_tokenizer_lengths_are_word_counts():
    builder = WordPromptBuilder()
    spec = WorkloadSpec(name="random", input_len=50, output_len=4)
    turn = next(conversations(spec, builder, seed=0)).turns[0]
    assert not builder.exact
    assert len(turn.text.split()) == 50 == turn.num_tokens


@pytest.mark.parametrize("name", ["random", "prefix", "multiturn"])
def test_streams_are_deterministic_for_a_seed(name):
    spec = WorkloadSpec(name=name, input_len=12, prefix_len=8, turns=2)
    first = texts(conversations(spec, WordPromptBuilder(), seed=7), 10)
    again = texts(conversations(spec, WordPromptBuilder(), seed=7), 10)
    other = texts(conversations(spec, WordPromptBuilder(), seed=8), 10)
    assert first == again
    assert first != other


def test_prefix_workload_shares_system_prompts_per_group():
    spec = WorkloadSpec(
        name="prefix", input_len=6, prefix_groups=3, prefix_questions=4, prefix_len=25
    )
    round_one = list(itertools.islice(conversations(spec, WordPromptBuilder(), seed=0), 12))
    groups = [c.prefix_group for c in round_one]
    assert sorted(groups) == sorted([0, 1, 2] * 4)  # N groups x M questions each
    assert groups != sorted(groups)  # shuffled, so routers see the groups interleaved
    systems = {g: {c.system_prompt for c in round_one if c.prefix_group == g} for g in range(3)}
    assert all(len(prompts) == 1 for prompts in systems.values())  # one shared prompt per group
    assert len({next(iter(p)) for p in systems.values()}) == 3
    assert all(len(c.system_prompt.split()) == 25 == c.system_tokens for c in round_one)
    assert len({c.turns[0].text for c in round_one}) == 12  # every question differs


def test_multiturn_and_take_requests_give_exact_request_counts():
    spec = WorkloadSpec(name="multiturn", input_len=5, output_len=3, turns=3)
    taken = take_requests(conversations(spec, WordPromptBuilder(), seed=0), 7)
    assert [len(c.turns) for c in taken] == [3, 3, 1]
    assert [c.conversation_id for c in taken] == [0, 1, 2]


def write_sharegpt(path, entries):
    path.write_text(json.dumps(entries))
    return str(path)


def exchange(prompt, reply, first="human"):
    return {"conversations": [{"from": first, "value": prompt}, {"from": "gpt", "value": reply}]}


def test_sharegpt_uses_first_exchange_and_filters_like_vllm(tmp_path, tokenizer_file):
    builder = TokenizerPromptBuilder(load_tokenizer(tokenizer_file))
    good = exchange("the engine serves tokens with low latency", "it was the best engine")
    entries = [
        good,
        exchange("hi", "a long enough reply to keep here"),  # prompt under 4 tokens
        exchange("a long enough prompt for the test", "ok"),  # reply under 4 tokens
        exchange("a prompt from the wrong side of the talk", "reply here", first="gpt"),
        {"conversations": [{"from": "human", "value": "no reply at all in this one"}]},
    ]
    path = write_sharegpt(tmp_path / "sg.json", entries)
    spec = WorkloadSpec(name="sharegpt", dataset_path=path)
    stream = conversations(spec, builder, seed=0)
    first_three = list(itertools.islice(stream, 3))  # one usable entry, cycled
    assert {c.turns[0].text for c in first_three} == {good["conversations"][0]["value"]}
    turn = first_three[0].turns[0]
    assert turn.num_tokens == builder.count(good["conversations"][0]["value"])
    assert turn.max_output_tokens == builder.count(good["conversations"][1]["value"])
    fixed = WorkloadSpec(name="sharegpt", dataset_path=path, sharegpt_output_len=64)
    assert next(conversations(fixed, builder, seed=0)).turns[0].max_output_tokens == 64


def test_bad_inputs_raise_config_errors(tmp_path):
    with pytest.raises(BenchConfigError, match="no usable"):
        path = write_sharegpt(tmp_path / "empty.json", [exchange("x", "y")])
        conversations(WorkloadSpec(name="sharegpt", dataset_path=path), WordPromptBuilder(), 0)
    with pytest.raises(BenchConfigError, match="--dataset-path"):
        conversations(WorkloadSpec(name="sharegpt"), WordPromptBuilder(), 0)
    with pytest.raises(BenchConfigError, match="tokenizer"):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(BenchConfigError, match="unknown workload"):
        conversations(WorkloadSpec(name="poems"), WordPromptBuilder(), 0)


def test_word_prompts_are_exact_in_the_gpt_oss_vocabulary(monkeypatch):
    """Without --tokenizer the lengths are still exact for GPT-OSS: checked with tiktoken's
    o200k_base (the GPT-OSS base vocabulary) from the shared test data."""
    import tiktoken
    import tiktoken_ext.openai_public as openai_public
    from tiktoken.load import load_tiktoken_bpe

    from gossamer.testing import data_dir

    ranks = load_tiktoken_bpe(str(data_dir() / "o200k_base.tiktoken"))
    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", lambda *_a, **_k: ranks)  # offline
    encoding = tiktoken.Encoding(**openai_public.o200k_base())
    assert all(len(encoding.encode(word)) == 1 for word in COMMON_WORDS)
    spec = WorkloadSpec(name="random", input_len=300, output_len=4)
    for conversation in itertools.islice(conversations(spec, WordPromptBuilder(), seed=2), 5):
        assert len(encoding.encode(conversation.turns[0].text)) == 300


@pytest.mark.slow  # builds the GPT-OSS tokenizer.json (a session fixture, ~8 s on 2 cores)
def test_exact_lengths_with_the_gpt_oss_tokenizer(
    o200k_harmony_tokenizer_json, tiktoken_o200k_harmony
):
    """--tokenizer with the real GPT-OSS tokenizer.json; lengths checked with tiktoken."""
    builder = make_prompt_builder(str(o200k_harmony_tokenizer_json))
    spec = WorkloadSpec(name="random", input_len=257, output_len=4)
    for conversation in itertools.islice(conversations(spec, builder, seed=4), 5):
        assert len(tiktoken_o200k_harmony.encode(conversation.turns[0].text)) == 257
