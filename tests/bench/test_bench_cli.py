"""`gossamer bench` end to end through `gossamer.cli.main`: sweeps, result files, the terminal
tables, `compare` with its PNGs, failures that do not stop a run, and option errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gossamer.cli import main
from tests.bench.fake_openai_server import MODEL, OWNED_BY, Behaviour, free_port

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def bench(*args: str) -> int:
    return main(["bench", *args])


def small_run(base_url: str, result_dir, *extra: str) -> list[str]:
    return [
        "--base-url",
        base_url,
        "--num-prompts",
        "6",
        "--input-len",
        "8",
        "--output-len",
        "4",
        "--result-dir",
        str(result_dir),
        "--no-progress",
        *extra,
    ]


def test_sweep_writes_one_result_per_run(fake_server, tmp_path, capsys):
    server = fake_server(Behaviour(token_delay=0.002, reasoning_tokens=1))
    args = small_run(
        f"{server.base_url}/v1",
        tmp_path,
        "--concurrency",
        "1,3",
        "--slo",
        "ttft_ms=5000,tpot_ms=5000",
        "--api-key",
        "sk-secret-123",
        "--header",
        "X-Team=team-value-xyz",
        "--seed",
        "11",
    )
    assert bench("run", *args) == 0
    out = capsys.readouterr().out
    assert out.count("Serving Benchmark Result") == 2
    assert "TTFCT" in out and "conc" in out  # per-run tables, then the sweep table
    files = sorted(tmp_path.glob("*.json"))
    assert [f.name for f in files] == [f"{OWNED_BY}-c1.json", f"{OWNED_BY}-c3.json"]
    for path, concurrency in zip(files, (1, 3), strict=True):
        text = path.read_text()
        assert "sk-secret-123" not in text and "team-value-xyz" not in text  # no secrets
        result = json.loads(text)
        assert result["label"] == OWNED_BY and result["config"]["model"] == MODEL
        assert result["config"]["concurrency"] == concurrency
        assert result["config"]["seed"] == 11 and result["config"]["ignore_eos"] is True
        assert result["config"]["header_names"] == ["Authorization", "X-Team"]
        assert result["versions"]["python"] and result["versions"]["httpx"]
        assert result["server"]["models"] == [MODEL]
        summary = result["summary"]
        assert summary["completed"] == 6 and len(result["requests"]) == 6
        assert summary["request_goodput"] == pytest.approx(summary["request_throughput"])
        assert summary["total_reasoning_tokens"] == 6 and summary["total_content_tokens"] == 18
        assert "content_text" not in result["requests"][0]
    # 2 warm-ups + 12 measured; the key and the header reached the server
    assert len(server.posts) == 14
    assert server.posts[0].headers["authorization"] == "Bearer sk-secret-123"
    assert server.posts[0].headers["x-team"] == "team-value-xyz"
    # each sweep point sends fresh prompts, so the second is not served from prefix cache
    prompts = [p.body["messages"][-1]["content"] for p in server.posts]
    assert not set(prompts[1:7]) & set(prompts[8:14])


def test_plain_bench_runs_without_the_run_word(fake_server, tmp_path):
    server = fake_server()
    args = small_run(
        server.base_url,
        tmp_path,
        "--endpoint",
        "completions",
        "--label",
        "mine",
        "--workload",
        "prefix",
        "--prefix-groups",
        "2",
        "--prefix-questions",
        "3",
        "--prefix-len",
        "5",
        "--warmup",
        "0",
        "--save-text",
    )
    assert bench(*args) == 0
    result = json.loads((tmp_path / "mine-c1.json").read_text())
    assert result["config"]["workload"]["name"] == "prefix"
    assert result["requests"][0]["content_text"] == "c0 c1 c2 c3 "
    prompts = [p.body["prompt"] for p in server.posts]
    assert len({" ".join(p.split()[:5]) for p in prompts}) == 2  # two shared 5-word prefixes
    assert all(len(p.split()) == 5 + 8 for p in prompts)


def test_failures_are_reported_and_the_run_goes_on(fake_server, tmp_path, capsys):
    server = fake_server(lambda i, _r: Behaviour(status=500) if i % 3 == 2 else Behaviour())
    assert bench("run", *small_run(server.base_url, tmp_path, "--warmup", "0")) == 0
    out = capsys.readouterr().out
    assert "HTTP 500:" in out and "Failed requests:" in out
    summary = json.loads(next(tmp_path.glob("*.json")).read_text())["summary"]
    assert (summary["completed"], summary["failed"]) == (4, 2)
    assert summary["errors"] == {"HTTP 500": 2}


def test_connection_refused_is_counted_not_crashed(tmp_path, capsys):
    url = f"http://127.0.0.1:{free_port()}"
    assert bench("run", *small_run(url, tmp_path, "--model", "m", "--request-timeout", "5")) == 1
    assert "ConnectError:" in capsys.readouterr().out
    summary = json.loads(next(tmp_path.glob("*.json")).read_text())["summary"]
    assert (summary["completed"], summary["failed"]) == (0, 6)
    # without --model the benchmark cannot even name a model: a clear error, exit code 2
    assert bench("run", *small_run(url, tmp_path)) == 2
    assert "pass --model" in capsys.readouterr().err


def test_compare_prints_side_by_side_and_writes_pngs(fake_server, tmp_path, capsys):
    fast = fake_server(Behaviour())
    slow = fake_server(Behaviour(token_delay=0.004))
    for server, label in ((fast, "fast"), (slow, "slow")):
        args = small_run(
            server.base_url,
            tmp_path / "res",
            "--label",
            label,
            "--concurrency",
            "1,2",
            "--warmup",
            "0",
        )
        assert bench(*args) == 0
    files = sorted(str(p) for p in (tmp_path / "res").glob("*.json"))
    capsys.readouterr()
    assert bench("compare", *files, "--out-dir", str(tmp_path / "plots")) == 0
    table = capsys.readouterr().out
    header = table.splitlines()[0]
    assert all(name in header for name in ("fast c=1", "fast c=2", "slow c=1", "slow c=2"))
    assert "median TPOT (ms)" in table
    pngs = sorted(p.name for p in (tmp_path / "plots").glob("*.png"))
    assert pngs == ["itl_cdf.png", "throughput_vs_per_user.png", "ttft_cdf.png"]
    for name in pngs:
        data = (tmp_path / "plots" / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000


@pytest.mark.parametrize(
    "extra",
    [
        ["--slo", "speed=3"],
        ["--concurrency", "0"],
        ["--concurrency", "two"],
        ["--num-prompts", "3", "--duration", "2"],
        ["--header", "novalue"],
        ["--extra-body", "[1]"],
        ["--workload", "sharegpt"],  # needs --dataset-path
    ],
)
def test_bad_options_exit_2_with_a_message(fake_server, tmp_path, capsys, extra):
    server = fake_server()
    assert bench("run", *small_run(server.base_url, tmp_path, *extra)) == 2
    assert "gossamer bench: error:" in capsys.readouterr().err
    assert not server.requests  # options are checked before the server is contacted


def test_compare_rejects_foreign_json(tmp_path, capsys):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    assert bench("compare", str(other), "--no-plots") == 2
    assert "not a `gossamer bench` result" in capsys.readouterr().err


def test_bench_imports_without_matplotlib():
    code = (
        "import sys, gossamer.bench.cli, gossamer.bench.loadgen, gossamer.bench.report, "
        "gossamer.bench.metrics; assert 'matplotlib' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
