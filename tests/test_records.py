"""benchmarks/records.py and benchmarks/report.py: a record appended is the row the
report writes, and the README's headline table is the one the records give."""
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
import records  # noqa: E402  (benchmarks/ is not a package)
import report  # noqa: E402


def test_an_appended_record_is_the_newest_row_of_the_report(tmp_path):
    folder = str(tmp_path / "results")
    records.append("cartpole_time_to_300", {"median_seconds": 4.4}, "python old", folder)
    written = records.append("cartpole_time_to_300", {"median_seconds": 3.9, "seeds": [0, 1]},
                             "python benchmarks/cartpole_time_to_score.py --seeds 0 1", folder)
    with open(os.path.join(folder, "cartpole_time_to_300.jsonl")) as fh:
        lines = [json.loads(line) for line in fh]
    assert [line["figure"]["median_seconds"] for line in lines] == [4.4, 3.9]
    assert written["machine"]["cores"] == os.cpu_count() and written["machine"]["cpu"]
    assert len(written["date"]) == 10 and written["commit"]  # YYYY-MM-DD; this checkout's HEAD

    readme = tmp_path / "README.md"
    readme.write_text(f"# Benchmarks\n\n{report.BEGIN}\nold table\n{report.END}\n\nthe rest\n")
    assert report.main(["--check", "--folder", folder, "--readme", str(readme)]) == 1
    assert report.main(["--folder", folder, "--readme", str(readme)]) == 0
    assert report.main(["--check", "--folder", folder, "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert "old table" not in text and text.endswith(f"{report.END}\n\nthe rest\n")
    rows = [line for line in text.splitlines() if line.startswith("| cartpole_time_to_300 ")]
    assert len(rows) == 1
    assert "median_seconds 3.9; seeds 0 / 1" in rows[0]
    assert "`python benchmarks/cartpole_time_to_score.py --seeds 0 1`" in rows[0]
    assert written["date"] in rows[0] and written["commit"] in rows[0]


def test_a_question_must_be_a_file_name(tmp_path):
    with pytest.raises(ValueError, match="names a file"):
        records.append("../elsewhere", {"x": 1}, "python x", str(tmp_path))



def test_the_readme_table_is_what_the_results_say():
    done = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "report.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
