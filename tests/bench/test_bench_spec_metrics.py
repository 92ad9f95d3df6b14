"""Speculative-decoding acceptance in bench results, read from the server's /metrics."""

from __future__ import annotations

import json

import pytest

from gossamer.bench.server_metrics import parse_spec_counters, spec_summary
from gossamer.cli import main

GOSSAMER_TEXT = """# HELP gossamer_spec_decode Speculative decoding statistics
# TYPE gossamer_spec_decode gauge
gossamer_spec_decode{stat="num_drafts"} 10.0
gossamer_spec_decode{stat="num_draft_tokens"} 40.0
gossamer_spec_decode{stat="num_accepted_tokens"} 25.0
gossamer_spec_decode{stat="acceptance_rate"} 0.625
"""
VLLM_TEXT = """# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{model_name="m"} 4.0
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{model_name="m"} 12.0
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 6.0
"""


def test_counters_are_read_from_gossamer_and_vllm_metrics():
    assert parse_spec_counters(GOSSAMER_TEXT) == {
        "num_drafts": 10, "num_draft_tokens": 40, "num_accepted_tokens": 25
    }  # fmt: skip
    assert parse_spec_counters(VLLM_TEXT) == {
        "num_drafts": 4, "num_draft_tokens": 12, "num_accepted_tokens": 6
    }  # fmt: skip
    assert parse_spec_counters("# nothing here\n") is None


def test_summary_is_the_difference_over_the_run():
    before = {"num_drafts": 10, "num_draft_tokens": 40, "num_accepted_tokens": 25}
    after = {"num_drafts": 30, "num_draft_tokens": 120, "num_accepted_tokens": 85}
    summary = spec_summary(before, after)
    assert summary["acceptance_rate"] == pytest.approx(60 / 80)
    assert summary["mean_accepted_length"] == pytest.approx(1 + 60 / 20)
    assert spec_summary(before, None) == {}
    assert spec_summary(None, after)["num_accepted_tokens"] == 85  # no counters yet = zeros


def test_bench_against_gossamer_with_ngram_records_acceptance(tmp_path):
    from gossamer.engine.async_engine import AsyncEngine
    from gossamer.engine.core import EngineConfig, EngineCore
    from gossamer.model.loader import load_model
    from gossamer.models import default_model_path
    from gossamer.server.app import build_app
    from gossamer.spec.config import parse_spec_config
    from gossamer.tokenizer import Tokenizer
    from tests.server.conftest import ServerThread

    path = default_model_path()
    model = load_model(str(path), dtype="float32", max_model_len=1024).model
    config = EngineConfig(num_blocks=256, speculative_config=parse_spec_config("ngram"))
    engine = AsyncEngine(EngineCore(model, Tokenizer.from_file(path), config), "gpt-oss-mini")
    try:
        with ServerThread(build_app(engine, served_model_name=["gpt-oss-mini"], api_key=None)) as s:
            code = main([
                "bench", "--base-url", s.base_url, "--endpoint", "completions",
                "--input-len", "64", "--output-len", "48", "--num-prompts", "3",
                "--concurrency", "1", "--warmup", "0", "--no-progress", "--tokenizer", str(path),
                "--result-dir", str(tmp_path), "--label", "spec", "--temperature", "0",
            ])  # fmt: skip
    finally:
        engine.shutdown()
    assert code == 0
    result = json.loads(next(tmp_path.glob("*.json")).read_text())
    spec = result["spec_decode"]
    assert spec["num_drafts"] > 0 and spec["num_accepted_tokens"] > 0
    assert 1 < spec["mean_accepted_length"] <= 1 + spec["num_draft_tokens"] / spec["num_drafts"]
