"""The real thing: `gossamer serve` machinery with the built-in gpt-oss-mini on the CPU, talked to
with the official openai client (issues 4 and 6)."""

from __future__ import annotations

import math
import time

import openai
import pytest
import torch

from gossamer.engine.async_engine import AsyncEngine
from gossamer.engine.core import EngineConfig, EngineCore
from gossamer.engine.reference import ContiguousCache, forward_tokens
from gossamer.model.loader import load_model
from gossamer.models import default_model_path
from gossamer.server.app import build_app
from gossamer.tokenizer import Tokenizer
from tests.server.conftest import ServerThread, wait_until

PYTHON_SNIPPETS = [
    'def read_lines(path):\n    """Return the lines of a text file."""\n    with open(path) as f:\n'
    "        return f.read().splitlines()\n",
    "import os\n\n\ndef join_all(parts):\n    return os.path.join(*parts)\n",
    "class Counter:\n    def __init__(self):\n        self.count = 0\n\n    def increment(self):\n"
    "        self.count += 1\n        return self.count\n",
]


@pytest.fixture(scope="module")
def mini():
    path = default_model_path()
    return load_model(str(path), dtype="float32", max_model_len=2048).model, Tokenizer.from_file(
        path
    )


@pytest.fixture(scope="module")
def live(mini):
    model, tokenizer = mini
    core = EngineCore(model, tokenizer, EngineConfig(num_blocks=512, max_num_seqs=8))
    engine = AsyncEngine(core, "gpt-oss-mini")
    with ServerThread(build_app(engine, served_model_name=["gpt-oss-mini"], api_key=None)) as srv:
        yield srv, core
    engine.shutdown()


def mean_loss(model, token_ids: list[int]) -> float:
    logits = forward_tokens(model, ContiguousCache(model, len(token_ids)), token_ids, 0)
    return float(torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(token_ids[1:])))


def test_built_in_model_predicts_python_far_better_than_a_random_model(mini):
    model, tokenizer = mini
    random_model = load_model(
        str(default_model_path()), load_format="dummy", dtype="float32", max_model_len=2048
    ).model
    for snippet in PYTHON_SNIPPETS:
        ids = tokenizer.encode(snippet)
        trained, untrained = mean_loss(model, ids), mean_loss(random_model, ids)
        assert trained < 0.5 * untrained, (snippet, trained, untrained)
        assert trained < math.log(model.config.vocab_size) / 2


def test_chat_over_http_returns_reasoning_and_content_quickly(live):
    server, _ = live
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none")
    start = time.monotonic()
    reply = client.chat.completions.create(
        model="gpt-oss-mini",
        messages=[{"role": "user", "content": "What does os.path.join do?"}],
        max_tokens=200,
        temperature=0,
    )
    elapsed = time.monotonic() - start
    message = reply.choices[0].message
    assert message.content, reply
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage.completion_tokens > 0
    assert elapsed < 30  # 2 shared CPU cores under a test suite; README quotes the idle figure


def test_streamed_completion_matches_offline_greedy_tokens(live, mini):
    server, _ = live
    model, tokenizer = mini
    prompt = PYTHON_SNIPPETS[0]
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none")
    stream = client.completions.create(
        model="gpt-oss-mini", prompt=prompt, max_tokens=24, temperature=0, stream=True
    )
    text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    expected = EngineCore(model, tokenizer, EngineConfig(num_blocks=64, max_num_seqs=1))
    from gossamer.sampling_params import SamplingParams

    expected.add_request(
        "x", tokenizer.encode(prompt), SamplingParams(temperature=0, max_tokens=24)
    )
    offline = ""
    while expected.has_unfinished_requests():
        offline += "".join(o.text_delta for o in expected.step())
    assert text == offline and text


def test_client_disconnect_frees_the_kv_blocks(live):
    server, core = live
    free_before = core.kv_cache_manager.num_free_blocks
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none")
    stream = client.completions.create(
        model="gpt-oss-mini",
        prompt="def main():\n",
        max_tokens=1000,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    for i, _ in enumerate(stream):
        if i == 5:
            break
    stream.close()
    assert wait_until(lambda: not core.has_unfinished_requests(), timeout=20)
    assert core.kv_cache_manager.num_free_blocks == free_before
