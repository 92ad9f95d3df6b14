"""Where a kernel's warps wait, per SASS instruction: reads Nsight Compute's source page as CSV.

    ncu --section SourceCounters -k regex:NAME -c 1 -o REPORT python3 ...
    ncu --import REPORT.ncu-rep --page source --csv --print-source sass --log-file PAGE.csv
    python benchmarks/ncu_source.py PAGE.csv [--top 40]

The page has one row per SASS instruction, with the warp-state samples that landed on it (ncu
samples each warp's program counter at a fixed interval and records why it could not issue). The
script prints, per kernel on the page, the share of samples per opcode and the instructions with
the most samples, each with its largest stall reasons: the instruction a warp waits at is the one
that consumes a result not yet ready, so its sources say what it waits for.

The CSV's column names differ between ncu versions, so the columns are found by pattern: the SASS
text ("Source"), the all-samples total ("Sampling (All"), and per-reason columns (names holding
"stall" or ncu's short reason names).
"""

from __future__ import annotations

import argparse
import collections
import csv
import re
from dataclasses import dataclass, field
from pathlib import Path

_REASONS = ("long_scoreboard", "short_scoreboard", "mio_throttle", "lg_throttle", "wait",
            "math_pipe_throttle", "not_selected", "selected", "barrier", "dispatch", "no_instruction",
            "branch_resolving", "membar", "drain", "sleeping", "tex_throttle", "imc_miss",
            "misc")  # fmt: skip


@dataclass
class SourcePage:
    """One kernel's rows: SASS text, all samples, and samples per stall-reason column."""

    name: str
    sass: list[str] = field(default_factory=list)
    samples: list[float] = field(default_factory=list)
    reasons: list[dict[str, float]] = field(default_factory=list)


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def _header_columns(row: list[str]) -> tuple[int, int, list[int]] | None:
    """(SASS column, all-samples column, reason columns) if `row` is a header, else None."""
    lowered = [cell.strip().lower() for cell in row]
    if "source" not in lowered:
        return None
    source = lowered.index("source")
    total = next((i for i, c in enumerate(lowered) if "sampling (all" in c), None)
    if total is None:
        total = next((i for i, c in enumerate(lowered) if "sampl" in c and "not" not in c), None)
    if total is None:
        return None
    # "(Not Issued)" columns repeat a reason's samples in cycles nothing issued: a subset
    reasons = [i for i, c in enumerate(lowered) if i != total and "sampl" not in c
               and "not issued" not in c
               and ("stall" in c or any(r in c.replace(" ", "_") for r in _REASONS))]  # fmt: skip
    return source, total, reasons


def read_pages(path: Path) -> list[SourcePage]:
    """The kernels' source pages in a CSV written by `ncu --page source --csv`."""
    pages: list[SourcePage] = []
    columns = None
    header: list[str] = []
    pending_name = ""
    with path.open(newline="") as handle:
        for row in csv.reader(handle):
            if not row:
                continue
            found = _header_columns(row)
            if found:
                columns, header = found, row
                pages.append(SourcePage(pending_name or f"kernel {len(pages) + 1}"))
                continue
            if columns is None or len(row) < len(header):
                pending_name = " ".join(c.strip() for c in row) if len(row) <= 2 else pending_name
                continue
            source, total, reason_cols = columns
            page = pages[-1]
            page.sass.append(row[source].strip())
            page.samples.append(_number(row[total]))
            page.reasons.append({header[i].strip(): _number(row[i]) for i in reason_cols})
    return pages


def opcode(sass: str) -> str:
    """'@!P0 LDG.E.U8 R1, [R2] ;' -> 'LDG.E.U8'."""
    text = re.sub(r"^@!?U?P\w+\s+", "", sass.strip())
    return text.split()[0] if text else ""


def print_page(page: SourcePage, top: int) -> None:
    total = sum(page.samples) or 1.0
    print(f"== {page.name}: {len(page.sass)} instructions, {total:.0f} samples")
    by_opcode: collections.Counter[str] = collections.Counter()
    for sass, count in zip(page.sass, page.samples, strict=True):
        by_opcode[opcode(sass)] += count
    shares = ", ".join(f"{op} {100 * n / total:.1f}%" for op, n in by_opcode.most_common(12))
    print(f"   by opcode: {shares}")
    reasons: collections.Counter[str] = collections.Counter()
    for row in page.reasons:
        reasons.update(row)
    if reasons:
        print("   by reason: " + ", ".join(f"{name} {100 * n / total:.1f}%"
                                         for name, n in reasons.most_common(8)))  # fmt: skip
    order = sorted(range(len(page.sass)), key=lambda i: -page.samples[i])[:top]
    for i in order:
        worst = sorted(page.reasons[i].items(), key=lambda item: -item[1])[:3]
        why = ", ".join(f"{name} {n:.0f}" for name, n in worst if n)
        print(f"   {100 * page.samples[i] / total:5.1f}%  #{i:<5} {page.sass[i][:70]:70}  {why}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("csv", type=Path)
    parser.add_argument("--top", type=int, default=30, help="instructions to list per kernel")
    args = parser.parse_args(argv)
    pages = read_pages(args.csv)
    if not pages:
        raise SystemExit(f"{args.csv}: no source page found (no 'Source' header with samples)")
    for page in pages:
        print_page(page, args.top)


if __name__ == "__main__":
    main()
