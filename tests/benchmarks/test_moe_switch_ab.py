"""benchmarks/moe_switch_ab.py: each value is in force while its call is checked and captured,
and the module's own value comes back (GPU timing stubbed out)."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_each_value_holds_during_its_capture_and_the_default_returns(benchmark_script,
                                                                    monkeypatch):  # fmt: skip
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    script = benchmark_script("moe_switch_ab")
    moe = script.moe
    default = moe.V2_GEMV_MAX_COUNT
    seen = []

    def fake_check(fn, experts, x, logits):
        seen.append(("check", moe.V2_GEMV_MAX_COUNT))
        return True, 0.0

    def fake_graph(calls):
        seen.append(("graph", moe.V2_GEMV_MAX_COUNT))
        return 1e-6 * len(calls)

    monkeypatch.setattr(script, "check", fake_check)
    monkeypatch.setattr(script, "graph_seconds_per_call", fake_graph)

    class Token:
        shape = (64, 8)

    for value in (0, 1):  # the default (0) restored after 1 too
        row = script.time_value(None, "V2_GEMV_MAX_COUNT", value, [(Token(), None)] * 3)
        assert row == {"value": str(value), "tokens": 64, "us": pytest.approx(3.0), "ok": True,
                       "rel_err": 0.0}  # fmt: skip
        assert moe.V2_GEMV_MAX_COUNT == default
    assert seen == [("check", 0), ("graph", 0), ("check", 1), ("graph", 1)]


def test_switches_name_moe_mxfp4_globals_or_those_of_another_kernel_module(benchmark_script,
                                                                           monkeypatch):  # fmt: skip
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    script = benchmark_script("moe_switch_ab")
    from gossamer.kernels import moe_grouped_gemv, moe_mxfp4

    assert script.switch_target("V2_BF16_PARTIALS") == (moe_mxfp4, "V2_BF16_PARTIALS")
    assert script.switch_target("moe_grouped_gemv.LOOP_M_ROWS") == (moe_grouped_gemv, "LOOP_M_ROWS")
    with pytest.raises(SystemExit, match="has no NOPE"):
        script.switch_target("moe_grouped_gemv.NOPE")


def test_ab_setup_measures_builds_and_prints_the_header(monkeypatch, capsys):
    """kernels_moe.ab_setup, the A/B scripts' shared start (the GPU parts stubbed out)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import kernels_moe

    experts = object()
    monkeypatch.setattr(kernels_moe, "copy_bandwidth", lambda: 3.01e12)
    monkeypatch.setattr(kernels_moe, "make_experts", lambda: experts)
    monkeypatch.setattr(kernels_moe.torch.cuda, "get_device_name", lambda: "GPU X")
    assert kernels_moe.ab_setup("V2_BF16_PARTIALS in [0, 1]") == (3.01e12, experts)
    header = capsys.readouterr().out.strip()
    assert header.startswith("# GPU X torch ") and header.endswith(
        " copy 3.01 TB/s V2_BF16_PARTIALS in [0, 1]"
    )
    kernels_moe.ab_setup()
    assert capsys.readouterr().out.strip().endswith("copy 3.01 TB/s")
