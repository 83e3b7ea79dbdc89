"""The headline table of benchmarks/README.md and docs/results.md, written from benchmarks/results/.

    python benchmarks/report.py            # rewrite the README's table and the docs page
    python benchmarks/report.py --check    # exit 1 if either is not what the records say

One row per question (a results/<question>.jsonl file): its newest record's figure,
machine, command, date and commit. In the README the table sits between the lines
BEGIN and END below and the rest is left as it is; docs/results.md is generated whole.
"""
from __future__ import annotations

import argparse
import os
import sys

import records

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
README = os.path.join(records.BENCHMARKS, "README.md")
PAGE = os.path.join(records.REPO, "docs", "results.md")  # the docs site's Results page
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


def page(new_table: str) -> str:
    """docs/results.md, whole: a heading, what the table is, and the table."""
    return ("# Results\n\n"
            "The newest record of each question the standing benchmarks answer: its figure, the\n"
            "machine it was measured on, the command that measured it, the date and the commit.\n"
            "fps = env frames per second = agent steps x frameskip (4 for Doom).\n"
            "`benchmarks/README.md` says what each benchmark measures and how to record a result;\n"
            "earlier figures are the earlier lines of each `benchmarks/results/<question>.jsonl`.\n\n"
            "Generated from `benchmarks/results/` by `python benchmarks/report.py`, which writes the\n"
            "same table into `benchmarks/README.md`: do not edit this page by hand.\n\n"
            + new_table + "\n")


def refresh(path: str, make, check: bool) -> bool:
    """Whether path's text differs from make(its text); written with the new text unless check."""
    text = ""
    if os.path.exists(path):
        with open(path) as fh:
            text = fh.read()
    fresh = make(text)
    if fresh != text and not check:
        with open(path, "w") as fh:
            fh.write(fresh)
    return fresh != text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table is stale")
    parser.add_argument("--folder", default=RESULTS, help="the records (default: benchmarks/results)")
    parser.add_argument("--readme", help="a README with the markers to write (default: benchmarks/README.md)")
    parser.add_argument("--page", help="a results page to write (default: docs/results.md)")
    args = parser.parse_args(argv)
    # Naming either file means that file alone; naming neither, the repository's two.
    readme, results_page = (args.readme, args.page) if args.readme or args.page else (README, PAGE)
    new_table = table(args.folder)
    stale = []
    if readme and refresh(readme, lambda text: with_table(text, new_table), args.check):
        stale.append(readme)
    if results_page and refresh(results_page, lambda text: page(new_table), args.check):
        stale.append(results_page)
    for path in stale if args.check else []:
        print(f"report: {path} is stale: run python benchmarks/report.py", file=sys.stderr)
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
