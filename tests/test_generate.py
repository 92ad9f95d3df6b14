"""`gossamer generate` against transformers' greedy generate."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from gossamer.cli import main
from tests.hf_models import load_hf_model, write_hf_model

PROMPT = [5, 17, 42, 99, 3, 250, 7]


def test_greedy_generate_json_matches_transformers(tmp_path, capsys):
    path = write_hf_model(tmp_path / "ckpt", seed=11, num_hidden_layers=4)
    hf = load_hf_model(path)
    with torch.inference_mode():
        expected = hf.generate(
            torch.tensor([PROMPT]), max_new_tokens=40, do_sample=False, min_new_tokens=40
        )[0, len(PROMPT) :].tolist()
    code = main(
        [
            "generate",
            "--model",
            str(path),
            "--prompt-token-ids",
            ",".join(map(str, PROMPT)),
            "--max-tokens",
            "40",
            "--json",
            "--ignore-eos",
            "--dtype",
            "float32",
        ]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["token_ids"] == expected
    assert len(result["token_ids"]) == 40


def test_seeded_sampling_is_reproducible_and_differs_across_seeds(tmp_path, capsys):
    path = write_hf_model(tmp_path / "ckpt", seed=12)
    runs = []
    for seed in (1, 1, 2):
        main(
            [
                "generate",
                "--model",
                str(path),
                "--prompt-token-ids",
                "1,2,3",
                "--max-tokens",
                "24",
                "--temperature",
                "1.5",
                "--seed",
                str(seed),
                "--json",
                "--ignore-eos",
            ]
        )
        runs.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["token_ids"])
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_console_entry_reports_bad_input_clearly(tmp_path):
    path = write_hf_model(tmp_path / "ckpt", seed=13)
    result = subprocess.run(
        [sys.executable, "-m", "gossamer.cli", "generate", "--model", str(path), "--prompt", "hi"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    assert "--prompt-token-ids" in result.stderr  # no tokenizer.json in this checkpoint
    missing = subprocess.run(
        [
            sys.executable,
            "-m",
            "gossamer.cli",
            "generate",
            "--model",
            str(tmp_path / "nope"),
            "--prompt-token-ids",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert missing.returncode == 2 and "neither a checkpoint folder nor a preset" in missing.stderr


def test_mxfp4_layout_flag_reaches_the_loader(monkeypatch):
    """--mxfp4-layout is one of the known layouts and goes to load_model (which repacks only for
    the Triton ops on a GPU); left out, the loader picks mxfp4.gpu_layout()."""
    import argparse

    import pytest

    from gossamer.engine import generate_cli

    seen = []
    monkeypatch.setattr(generate_cli, "load_model", lambda *a, **kw: seen.append(kw))
    parser = argparse.ArgumentParser()
    generate_cli.add_model_arguments(parser)
    generate_cli.load_from_args(parser.parse_args(["--mxfp4-layout", "lanes_13_9"]))
    generate_cli.load_from_args(parser.parse_args([]))
    assert [kw["mxfp4_layout"] for kw in seen] == ["lanes_13_9", None]
    with pytest.raises(SystemExit):
        parser.parse_args(["--mxfp4-layout", "nibbles"])
