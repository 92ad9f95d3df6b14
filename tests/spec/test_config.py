"""--speculative-config parsing: vLLM-style JSON, files, bare method names, clear errors."""

from __future__ import annotations

import argparse
import json

import pytest

from gossamer.spec.config import (
    SpecConfig,
    SpecConfigError,
    add_spec_arguments,
    parse_spec_config,
    spec_config_from_args,
)


def test_vllm_style_json_and_shorthands(tmp_path):
    config = parse_spec_config(
        '{"method": "ngram", "num_speculative_tokens": 4, '
        '"prompt_lookup_max": 4, "prompt_lookup_min": 2}'
    )
    assert config == SpecConfig(method="ngram", num_speculative_tokens=4)
    assert parse_spec_config("suffix").method == "suffix"
    assert parse_spec_config("auto").proposer_methods == ("ngram", "suffix")
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"method": "auto", "methods": ["suffix", "ngram"]}))
    assert parse_spec_config(str(path)).proposer_methods == ("suffix", "ngram")
    assert parse_spec_config(None) is None


def test_auto_adds_the_model_method(tmp_path):
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"architectures": ["GptOssForCausalLM"]}))
    config = parse_spec_config({"method": "auto", "model": str(draft)})
    assert config.proposer_methods == ("ngram", "suffix", "draft")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('{"method": "medusa"}', "method must be one of"),
        ('{"method": "draft"}', "model is required"),
        ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens"),
        ('{"method": "ngram", "prompt_lookup_min": 5}', "prompt_lookup_max"),
        ('{"method": "ngram", "lookahead": 3}', "unknown keys"),
        ('{"method": "ngram", "num_speculative_tokens": "4"}', "speculative config"),
        ("{not json", "neither JSON nor a method name"),
        ('["ngram"]', "JSON object"),
    ],
)
def test_bad_configs_raise_typed_errors(value, message):
    with pytest.raises(SpecConfigError, match=message):
        parse_spec_config(value)


def test_cli_flag():
    parser = argparse.ArgumentParser()
    add_spec_arguments(parser)
    args = parser.parse_args(["--speculative-config", '{"method": "suffix"}'])
    assert spec_config_from_args(args).method == "suffix"
    assert spec_config_from_args(parser.parse_args([])) is None


def test_cost_aware_is_on_for_auto_and_can_be_set_for_any_method():
    assert parse_spec_config("auto").chooses_k
    assert not parse_spec_config("ngram").chooses_k
    assert parse_spec_config('{"method": "ngram", "cost_aware": true}').chooses_k
    assert not parse_spec_config('{"method": "auto", "cost_aware": false}').chooses_k
    assert parse_spec_config("ngram").pad_drafts


def test_cost_tables_from_json_lists_maps_and_files(tmp_path):
    as_lists = parse_spec_config('{"method": "auto", "cost_table": {"8": [13, 26], "1": [4, 5]}}')
    assert as_lists.cost_table == ((1, ((0, 4.0), (1, 5.0))), (8, ((0, 13.0), (1, 26.0))))
    sparse = parse_spec_config({"method": "auto", "cost_table": {"1": {"0": 4, "3": 8}}})
    assert sparse.cost_table == ((1, ((0, 4.0), (3, 8.0))),)
    # the file the verify-cost benchmark writes: the table under "cost_table"
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"cost_table": {"1": {"0": 4, "3": 8}}}))
    from_file = parse_spec_config({"method": "auto", "cost_table": str(path)})
    assert from_file.cost_table == sparse.cost_table
    assert SpecConfig(method="auto", cost_table=from_file.cost_table) == from_file


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"1": [4]}, "needs a batch >= 1"),
        ({"1": {"1": 4, "2": 5}}, "needs a batch >= 1"),
        ({"0": [4, 5]}, "needs a batch >= 1"),
        ({"1": [4, 0]}, "costs must be > 0"),
        ({"one": [4, 5]}, "must map batch sizes"),
        ({}, "is empty"),
        ("/no/such/costs.json", "cannot read cost_table"),
    ],
)
def test_bad_cost_tables_raise_typed_errors(table, message):
    with pytest.raises(SpecConfigError, match=message):
        SpecConfig(method="auto", cost_table=table)
