"""benchmarks/graph_timeline.py: cutting a profiled trace into steps and reading it as a chain."""

from __future__ import annotations

import sys

import pytest

from tests.benchmarks.conftest import BENCHMARKS


@pytest.fixture
def tl(benchmark_script, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    yield benchmark_script("graph_timeline")
    for name in ("decode_speed", "throughput", "timing"):
        sys.modules.pop(name, None)


def _step(tl, t0: float, pdl_overlap: float = 0.0):
    """One step of three kernels: the embedding 3 us, a norm 2 us after a 1 us gap, a gemv 10 us
    started `pdl_overlap` before the norm ends."""
    embed = tl.Event("_embed_kernel", t0, t0 + 3)
    norm = tl.Event("norm", t0 + 4, t0 + 6)
    gemv = tl.Event("gemv", t0 + 6 - pdl_overlap, t0 + 16)
    return [embed, norm, gemv]


def test_steps_start_at_each_embedding(tl):
    events = [e for i in range(3) for e in _step(tl, 100.0 * i)]
    early_copy = tl.Event("Memcpy HtoD", -5.0, -4.0)  # before the first step: dropped
    steps = tl.split_steps(list(reversed(events)) + [early_copy])  # start order restored
    assert [[e.name for e in s] for s in steps] == [["_embed_kernel", "norm", "gemv"]] * 3
    assert steps[1][0].start == 100.0
    with pytest.raises(ValueError, match="two are needed"):
        tl.split_steps(events[:3])
    # without the Triton embedding, torch's indexing kernel starts each step
    renamed = [tl.Event("index_elementwise_kernel<128>" if e.name == "_embed_kernel" else e.name,
                        e.start, e.end) for e in events]  # fmt: skip
    assert [len(s) for s in tl.split_steps(renamed)] == [3, 3, 3]


def test_steps_line_up_by_call_not_position(tl):
    """A copy that starts before the norm in one step and after it in the next is one key."""
    one = [
        tl.Event("copy", 0, 1),
        tl.Event("k", 1, 3),
        tl.Event("k", 3, 4),
        tl.Event("ArgMax", 4, 5),
    ]
    two = [tl.Event("k", 10, 12), tl.Event("copy", 10.5, 11), tl.Event("k", 12, 13)]
    two.append(tl.Event("ArgMax", 13, 14))
    assert tl.keyed(two) == [("k", 0), ("copy", 0), ("k", 1), ("ArgMax", 0)]
    result = tl.timeline([one, two, one])
    k = next(row for row in result["kernels"] if row["name"] == "k")
    assert k["calls_per_step"] == 2
    assert k["end_delta_us_per_step"] == 3.0  # 2 + 1 in both steps, whatever the copy did


def test_end_deltas_charge_overlapped_kernels_only_what_they_add(tl):
    step = _step(tl, 0.0, pdl_overlap=1.5)
    # the gemv started 1.5 us early (PDL) but adds 10 us after the norm's end, not 11.5; the
    # norm adds its 2 us and the gap before it
    assert tl.end_deltas(step, 0.0) == [3.0, 3.0, 10.0]
    inside = [tl.Event("a", 0, 10), tl.Event("b", 1, 4)]  # ends inside a's span: adds nothing
    assert tl.end_deltas(inside, 0.0) == [10.0, 0.0]


def test_timeline_sums_to_the_period(tl):
    starts = [0.0, 20.0, 41.0, 60.0]  # periods 20, 21, 19: median 20
    steps = [_step(tl, t0, pdl_overlap=1.0) for t0 in starts]
    result = tl.timeline(steps)
    assert result["period_us"] == 20.0
    assert result["span_us"] == 16.0
    assert result["idle_us"] == 4.0
    rows = {row["name"]: row for row in result["kernels"]}
    assert rows["gemv"]["median_us"] == 11.0  # its duration includes the PDL wait
    assert rows["gemv"]["end_delta_us_per_step"] == 10.0
    assert [row["name"] for row in result["kernels"]] == ["gemv", "_embed_kernel", "norm"]
    total = sum(row["end_delta_us_per_step"] for row in result["kernels"])
    assert total + result["idle_us"] == result["period_us"]


def test_names_called_several_times_a_step_add_up(tl):
    def step(t0):
        return [
            tl.Event("k", t0, t0 + 1),
            tl.Event("k", t0 + 1, t0 + 4),
            tl.Event("z", t0 + 4, t0 + 5),
        ]

    result = tl.timeline([step(0.0), step(10.0)])
    k = next(row for row in result["kernels"] if row["name"] == "k")
    assert k["calls_per_step"] == 2
    assert k["end_delta_us_per_step"] == 4.0
    assert k["median_end_delta_us"] == 2.0


def test_kernels_called_twice_a_layer_get_a_row_per_call(tl):
    """Two layers of (gemv, norm, gemv): with layers=2 the GEMV's first and second call in each
    layer are rows of their own, as QKV and O are."""

    def step(t0):
        names = ["gemv", "norm", "gemv"] * 2 + ["ArgMax"]
        lengths = [3, 1, 2] * 2 + [1]
        events, t = [], t0
        for name, length in zip(names, lengths, strict=True):
            events.append(tl.Event(name, t, t + length))
            t += length
        return events

    result = tl.timeline([step(0.0), step(20.0)], layers=2)
    rows = {row["name"]: row for row in result["kernels"]}
    assert rows["gemv #0"]["end_delta_us_per_step"] == 6.0  # 3 us in each of two layers
    assert rows["gemv #1"]["end_delta_us_per_step"] == 4.0
    assert rows["norm"]["calls_per_step"] == 2 and "gemv" not in rows
    assert tl.role("gemv", 3, 4, 2) == "gemv #1" and tl.role("x", 1, 1, 2) == "x"
    # 2 a layer + one after the layers (QKV, O, then a Triton unembedding)
    assert [tl.role("g", c, 5, 2) for c in range(5)] == ["g #0", "g #1", "g #0", "g #1", "g (last)"]
    assert [tl.role("n", c, 3, 2) for c in range(3)] == ["n", "n", "n (last)"]


def test_floors_name_the_parts_whose_bytes_are_known(tl):
    from gossamer.presets import preset

    cfg = preset("gpt-oss-20b")
    parts = tl.part_bytes(cfg)
    assert parts["qkv"] == 2 * 24 * 2880 * 5120 and parts["unembed"] == 2 * 201088 * 2880
    # four experts' gate_up per layer: 2 x 2880 rows of 2880 weights at 17/32 bytes a weight
    assert parts["gate_up"] == 24 * 4 * 2 * 2880 * 2880 * 17 / 32
    row = {"median_us": 0.0, "median_end_delta_us": 0.0, "end_delta_us_per_step": 0.0}
    table = [
        {"name": "_gemv_dot_kernel #0", **row},
        {"name": "nvjet_sm90_tst_bf16_gemv", **row},
        {"name": "_rms_norm_kernel", **row},
    ]
    tl.floors(table, cfg, bandwidth=1e12)  # 1 TB/s: a byte is 1e-6 us
    assert table[0]["floor_us_per_step"] == parts["qkv"] / 1e6
    assert table[1]["floor_us_per_step"] == parts["unembed"] / 1e6  # cuBLAS: the unembedding
    assert "floor_us_per_step" not in table[2]
    table.append({"name": "_gemv_dot_kernel (last)", **row})  # a Triton unembedding: not cuBLAS
    del table[1]["floor_us_per_step"]
    tl.floors(table, cfg, bandwidth=1e12)
    assert "floor_us_per_step" not in table[1]
    assert table[3]["floor_us_per_step"] == parts["unembed"] / 1e6
