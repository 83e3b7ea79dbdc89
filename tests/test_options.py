"""The two tiers of fastrl's options: `--help` lists the common ones, grouped as
Config's sections; `--help_all` lists every one, under the same headings. Help texts
stay short; the reasons behind them are in docs/options.md, generated from Config."""
import dataclasses
import os
import re
import subprocess
import sys

from helpers import REPO

from fastrl.config import Config, build_parser, options_markdown

FIELDS = dataclasses.fields(Config)
COMMON = [f.name for f in FIELDS if f.metadata["common"]]
MOST_COMMON = 25  # what a newcomer reads before the first run; the rest is --help_all's
HELP_WORDS = 25  # one line of what the option does; why it is so goes into `why`


def run_help(module: str, flag: str) -> str:
    out = subprocess.run([sys.executable, "-m", module, flag], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def listed_options(text: str) -> list:
    """The options a help text lists, in order (-h, --help aside): each opens its own line."""
    return re.findall(r"^  (--\w+)", text, re.M)


def sections_in_order() -> list:
    return list(dict.fromkeys(f.metadata["section"] for f in FIELDS))


def test_every_option_is_declared_in_a_section_and_a_tier():
    for f in FIELDS:
        assert f.metadata["section"], f"{f.name} is declared before the first _section()"
        assert isinstance(f.metadata["common"], bool), f.name
    assert 0 < len(COMMON) <= MOST_COMMON


def test_help_lists_only_the_common_options_under_their_sections():
    text = run_help("fastrl.train", "--help")
    assert listed_options(text) == ["--help_all", "--config", *(f"--{name}" for name in COMMON)]
    # A section with a common option keeps its heading; one without any is left out.
    headings = [s for s in sections_in_order() if any(f.metadata["common"] and f.metadata["section"] == s
                                                      for f in FIELDS)]
    assert [h for h in re.findall(r"^(\S.*):$", text, re.M) if h != "options"] == headings
    assert "--help_all lists all" in text and "docs/options.md" in text


def test_help_all_lists_every_option_grouped_as_the_dataclass_declares_them():
    text = run_help("fastrl.train", "--help_all")
    assert listed_options(text) == ["--help_all", "--config", *(f"--{f.name}" for f in FIELDS)]
    assert [h for h in re.findall(r"^(\S.*):$", text, re.M) if h != "options"] == sections_in_order()


def test_an_option_left_out_of_help_still_parses():
    rare = next(f.name for f in FIELDS if not f.metadata["common"] and f.type in ("int", int))
    args = build_parser().parse_args([f"--{rare}", "7"])
    assert getattr(args, rare) == 7


def test_bench_help_keeps_its_own_options_beside_the_common_ones():
    text = run_help("fastrl.bench", "--help")
    listed = listed_options(text)
    assert {"--mode", "--seconds", "--warmup", "--json", "--env", "--lr"} <= set(listed)
    assert "--vtrace_lambda" not in listed
    assert {"--mode", "--vtrace_lambda"} <= set(listed_options(run_help("fastrl.bench", "--help_all")))


def test_every_help_text_says_what_its_option_does_in_a_few_words():
    long = {f.name: len(f.metadata["help"].split()) for f in FIELDS if len(f.metadata["help"].split()) > HELP_WORDS}
    assert long == {}, f"over {HELP_WORDS} words: move the reasons to _opt(..., why=...)"


def test_help_texts_name_no_machine_and_no_diary():
    # The texts outlive the machines they were measured on; benchmarks/README.md keeps those.
    banned = re.compile(r"\b(EPYC|Xeon|Zen|H200)\b|\bsess(ion)s?\b", re.I)  # no CPU names, no diary
    for f in FIELDS:
        for key in ("help", "why"):
            assert not banned.search(f.metadata[key]), (f.name, key, f.metadata[key])


def test_the_options_page_is_what_the_generator_writes():
    with open(os.path.join(REPO, "docs", "options.md")) as fh:
        page = fh.read()
    assert page == options_markdown(), "docs/options.md is stale: python -m fastrl.config --markdown > docs/options.md"
    for f in FIELDS:
        assert f"`--{f.name}" in page
        if f.metadata["why"]:
            assert f.metadata["why"].replace("|", "\\|").replace("<", "&lt;") in page, f.name


def test_the_generator_runs_as_documented(tmp_path):
    out = subprocess.run([sys.executable, "-m", "fastrl.config", "--markdown"], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout == options_markdown()
