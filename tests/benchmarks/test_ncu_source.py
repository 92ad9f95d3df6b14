"""benchmarks/ncu_source.py: stall samples per SASS instruction from ncu's source page (CSV)."""

from __future__ import annotations

PAGE = """==PROF== Disconnected
"Kernel Name","_v2_gate_up_kernel"
"# Address","Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","stall_long_sb","stall_long_sb (Not Issued)","stall_short_sb","Instructions Executed"
"1","0x10","IADD3 R5, P0, R0, UR10, RZ ;","10","5","0","0","3","1000"
"2","0x20","@!P0 LDG.E.U8 R1, [R2.64] ;","200","180","170","150","0","1000"
"3","0x30","HMUL2.BF16_V2 R3, R4, R5 ;","50","20","0","0","10","4000"
"Kernel Name","_v2_down_kernel"
"# Address","Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","stall_long_sb","stall_short_sb","Instructions Executed"
"1","0x10","LDS.128 R4, [R9] ;","7","7","0","7","10"
"""


def test_pages_split_per_kernel_with_samples_and_reasons(benchmark_script, tmp_path, capsys):
    bench = benchmark_script("ncu_source")
    path = tmp_path / "page.csv"
    path.write_text(PAGE)
    gate_up, down = bench.read_pages(path)
    assert gate_up.name.endswith("_v2_gate_up_kernel") and down.name.endswith("_v2_down_kernel")
    assert [bench.opcode(s) for s in gate_up.sass] == ["IADD3", "LDG.E.U8", "HMUL2.BF16_V2"]
    assert gate_up.samples == [10, 200, 50]
    assert gate_up.reasons[1] == {"stall_long_sb": 170, "stall_short_sb": 0}  # not "Not Issued"
    assert down.samples == [7]
    bench.main([str(path), "--top", "1"])
    out = capsys.readouterr().out
    assert "LDG.E.U8 76.9%" in out  # 200 of 260 samples
    assert "stall_long_sb 170" in out
