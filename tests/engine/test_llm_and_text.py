"""Offline LLM.generate and the text side of the engine (stop strings across token boundaries)
on the built-in model and its real tokenizer."""

from __future__ import annotations

import pytest

from gossamer.engine.detokenizer import TextState
from gossamer.engine.llm import LLM
from gossamer.engine.reference import generate_stream
from gossamer.models import default_model_path
from gossamer.sampling_params import SamplingParams
from gossamer.tokenizer import Tokenizer

PROMPTS = ["import os\n\n\ndef ", "class Stack:\n    def __init__(self):\n", "# Read a file\n"]


@pytest.fixture(scope="module")
def llm():
    return LLM(str(default_model_path()), dtype="float32", max_model_len=512, num_blocks=256)


def test_generate_returns_results_in_prompt_order_matching_the_reference(llm):
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    results = llm.generate(PROMPTS, params, use_tqdm=False)
    model = llm.engine.runner.model
    for prompt, result in zip(PROMPTS, results, strict=True):
        ids = llm.tokenizer.encode(prompt)
        assert result.prompt_token_ids == ids
        expected = list(generate_stream(model, ids, 16))
        assert result.outputs[0].token_ids == expected
        assert result.outputs[0].text == llm.tokenizer.decode(expected, skip_special=True)
        assert result.outputs[0].finish_reason == "length"


def test_stop_string_cuts_the_text_and_ends_the_request(llm):
    free = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    full = llm.generate(PROMPTS[1], free, use_tqdm=False)[0].outputs[0].text
    stop = full[10:14]  # four characters from the middle, likely spanning tokens
    first = full.find(stop)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[stop])
    cut = llm.generate(PROMPTS[1], params, use_tqdm=False)[0].outputs[0]
    assert cut.text == full[:first]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert len(cut.token_ids) < 40
    kept = SamplingParams(
        temperature=0, max_tokens=40, ignore_eos=True, stop=[stop], include_stop_str_in_output=True
    )
    assert llm.generate(PROMPTS[1], kept, use_tqdm=False)[0].outputs[0].text == full[: first + 4]


def test_streamed_deltas_never_send_text_that_a_stop_string_later_cuts():
    tokenizer = Tokenizer.from_file(default_model_path())
    text = "alpha beta gamma delta"
    state = TextState(tokenizer, ("gamma",), include_stop_str=False, skip_special=True)
    sent = ""
    for token in tokenizer.encode(text):
        state.add_token(token)
        sent += state.take_delta(final=False)
        assert "gam" not in sent  # a prefix of the stop string is held back, never sent
    state.finish()
    sent += state.take_delta(final=True)
    assert sent == "alpha beta " and state.stopped_by == "gamma"


def test_n_choices_and_logprobs_come_back_per_choice(llm):
    params = SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=8, logprobs=2, ignore_eos=True)
    result = llm.generate(PROMPTS[0], params, use_tqdm=False)[0]
    assert [c.index for c in result.outputs] == [0, 1]
    for choice in result.outputs:
        assert len(choice.token_ids) == 8 and len(choice.logprobs) == 8
        pairs = zip(choice.logprobs, choice.token_ids, strict=True)
        assert all(entry.token_id == t for entry, t in pairs)
        assert all(len(entry.top) == 2 for entry in choice.logprobs)
