"""The headline table of benchmarks/README.md, written from benchmarks/results/.

    python benchmarks/report.py            # rewrite the table between the markers
    python benchmarks/report.py --check    # exit 1 if the table is not what the records say

One row per question (a results/<question>.jsonl file): its newest record's figure,
machine, command, date and commit. The table sits between the lines BEGIN and END
below; the rest of the README is left as it is.
"""
from __future__ import annotations

import argparse
import os
import sys

import records

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
README = os.path.join(records.BENCHMARKS, "README.md")
RESULTS = os.path.join(records.BENCHMARKS, "results")  # the repository's own, whatever records' default


def number(value) -> str:
    """A figure's value as the table shows it; None (not reached, not measured) is "-"."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    if isinstance(value, list):
        return " / ".join(number(v) for v in value)
    return str(value)


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def row(question: str, record: dict) -> str:
    figure = "; ".join(f"{key} {number(value)}" for key, value in record.get("figure", {}).items())
    box = record.get("machine") or {}
    machine = ", ".join(part for part in (box.get("cpu") or "CPU unknown",
                                          f"{box['cores']} cores" if box.get("cores") else "",
                                          box.get("gpu") or "") if part)
    command = f"`{record['command']}`" if record.get("command") else "unknown"
    date, commit = record.get("date") or "unknown", record.get("commit") or "unknown"
    return "| " + " | ".join(cell(text) for text in (question, figure, machine, command, date, commit)) + " |"


def table(folder: str) -> str:
    lines = ["| question | figure | machine | command | date | commit |", "| --- | --- | --- | --- | --- | --- |"]
    lines += [row(question, record) for question, record in sorted(records.newest(folder).items())]
    return "\n".join(lines)


def with_table(text: str, new_table: str) -> str:
    """The README's text with the table between the markers replaced."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"report: the README needs a line {BEGIN} and, after it, a line {END}")
    return text[:start + len(BEGIN)] + "\n" + new_table + "\n" + text[end:]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if the table is stale")
    parser.add_argument("--folder", default=RESULTS, help="the records (default: benchmarks/results)")
    parser.add_argument("--readme", default=README)
    args = parser.parse_args(argv)
    with open(args.readme) as fh:
        text = fh.read()
    fresh = with_table(text, table(args.folder))
    if args.check:
        if fresh != text:
            print(f"report: the table in {args.readme} is stale: run python benchmarks/report.py", file=sys.stderr)
            return 1
        return 0
    if fresh != text:
        with open(args.readme, "w") as fh:
            fh.write(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
