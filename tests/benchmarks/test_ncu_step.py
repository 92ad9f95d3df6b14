"""benchmarks/ncu_step.py: the table from Nsight Compute's raw CSV, and the step driver on the CPU."""

from __future__ import annotations

import pytest

STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
DRAM = "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"
HEADER = ["ID", "Kernel Name", "Grid Size", "gpu__time_duration.sum", DRAM, "dram__bytes.sum.per_second",
          STALL.format("long_scoreboard"), STALL.format("wait"), STALL.format("math_pipe_throttle")]  # fmt: skip


def write_csv(path, rows) -> None:
    lines = ["==PROF== Connected to process 1 (python3)"]
    lines.append(",".join(f'"{h}"' for h in HEADER))
    lines.append(",".join(f'"{u}"' for u in ["", "", "", "usecond", "%", "Tbyte/s", "", "", ""]))
    lines += [",".join(f'"{v}"' for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")


def test_kernels_are_grouped_by_name_and_ranked_by_time(benchmark_script, tmp_path, capsys):
    bench = benchmark_script("ncu_step")
    path = tmp_path / "ncu.csv"
    write_csv(
        path,
        [
            [0, "gemv", "(9, 1, 1)", "2.0", "40", "2.0", "5.0", "1.0", "0.5"],
            [1, "moe_grouped", "(4, 1, 1)", "10.0", "50", "2.5", "3.0", "2.0", "4.0"],
            [2, "gemv", "(9, 1, 1)", "4.0", "60", "3.0", "7.0", "1.0", "0.5"],
            [3, "gemv", "(2, 15, 1)", "1.0", "1", "0.1", "1.0", "1.0", "0.5"],
        ],
    )
    kernels = bench.read_raw_csv(path)
    assert [k.name for k in kernels] == [
        "moe_grouped (4, 1, 1)",
        "gemv (9, 1, 1)",
        "gemv (2, 15, 1)",
    ]
    gemv = kernels[1]
    assert gemv.launches == 2 and gemv.total_us == pytest.approx(6.0)
    assert gemv.mean(DRAM) == pytest.approx(50)
    assert gemv.mean("dram__bytes.sum.per_second") == pytest.approx(2500)  # GB/s
    assert gemv.top_stalls(2) == [("long_scoreboard", 6.0), ("wait", 1.0)]
    assert kernels[0].top_stalls(1) == [("math_pipe_throttle", 4.0)]
    bench.print_table(kernels, top=5, stalls=2)
    printed = capsys.readouterr().out
    assert "3 kernels, 4 launches, 17.0 us" in printed
    assert "math_pipe_throttle 4.0, long_scoreboard 3.0" in printed


def test_durations_in_nanoseconds_become_microseconds(benchmark_script, tmp_path):
    bench = benchmark_script("ncu_step")
    path = tmp_path / "ncu.csv"
    write_csv(path, [[0, "gemv", "(1, 1, 1)", "2,500", "40", "1", "1", "1", "1"]])
    path.write_text(path.read_text().replace('"usecond"', '"nsecond"'))
    (gemv,) = bench.read_raw_csv(path)
    assert gemv.total_us == pytest.approx(2.5)


def test_the_step_driver_runs_on_the_cpu(benchmark_script, capsys):
    benchmark_script("ncu_step").main(["run", "--smoke", "--batch", "2"])
    assert "profiled one eager step" in capsys.readouterr().out


def test_pipe_use_columns_where_the_csv_has_them(benchmark_script, tmp_path, capsys):
    """`--pipes`: the SM pipes' use (ncu's InstructionStats) as extra columns, only those present."""
    bench = benchmark_script("ncu_step")
    alu = "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_elapsed"
    path = tmp_path / "ncu.csv"
    lines = ['"ID","Kernel Name","Grid Size","gpu__time_duration.sum","' + alu + '"']
    lines += ['"","","","usecond","%"', '"0","v2_gate_up","(45, 144, 1)","198.5","48.5"']
    path.write_text("\n".join(lines) + "\n")
    kernels = bench.read_raw_csv(path)
    bench.print_table(kernels, top=5, stalls=2, pipes=True)
    header, row = capsys.readouterr().out.splitlines()[1:3]
    assert "alu%" in header and "tensor%" not in header
    assert row.split()[-1] == "48.5"


def test_columns_matching_a_pattern_print_per_kernel(benchmark_script, tmp_path, capsys):
    """`--match`: raw columns by regex (the shared-memory bank conflicts), a line per kernel."""
    bench = benchmark_script("ncu_step")
    conflicts = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"
    path = tmp_path / "ncu.csv"
    lines = ['"ID","Kernel Name","Grid Size","gpu__time_duration.sum","' + conflicts + '","other"']
    lines += ['"","","","usecond","",""', '"0","v2_gate_up","(45, 144, 1)","198.5","1,200","7"']
    lines += ['"1","v2_gate_up","(45, 144, 1)","201.5","1,400","7"']
    path.write_text("\n".join(lines) + "\n")
    bench.print_table(bench.read_raw_csv(path), top=5, stalls=2, match="bank_conflicts")
    matched = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert len(matched) == 1 and conflicts in matched[0]
    assert matched[0].split()[-1] == "1300.0"
