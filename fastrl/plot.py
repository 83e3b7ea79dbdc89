"""`python -m fastrl.plot EXP_DIR [EXP_DIR...] --out curves.png`: compare runs
without a dashboard.

Draws one metric from each experiment's TensorBoard events (default: the mean return
of the last 100 episodes) against env frames and against wall time from the run's
first event (a resumed run shows its pause as a flat stretch); --by_policy draws one
line per policy.
"""
from __future__ import annotations

import importlib.util
import os
import re
import sys
from typing import List, NamedTuple

from fastrl.config import OneLineParser
from fastrl.plumbing.files import cannot_write

DEFAULT_METRIC = "train/return_mean_100"
POLICY_METRIC = re.compile(r"policy_(\d+)/return_100")  # one per policy of a --num_policies run


class PlotError(Exception):
    """An experiment that cannot be plotted; the message says which and why."""


class Curve(NamedTuple):
    label: str
    frames: List[int]
    seconds: List[float]
    values: List[float]


def _events(exp_dir: str):
    """<exp_dir>/tb's scalars, every point of them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb_dir = os.path.join(exp_dir, "tb")
    if not os.path.isdir(tb_dir):
        raise PlotError(f"{exp_dir} has no TensorBoard folder {tb_dir}; give the folder of an experiment that trained.")
    acc = EventAccumulator(tb_dir, size_guidance={"scalars": 0})  # 0 = keep every point, not a sample
    acc.Reload()
    return acc


def _curve(acc, metric: str, label: str) -> Curve:
    events = acc.Scalars(metric)
    t0 = events[0].wall_time
    return Curve(label=label, frames=[e.step for e in events], seconds=[e.wall_time - t0 for e in events],
                 values=[e.value for e in events])


def _run_label(exp_dir: str) -> str:
    return os.path.basename(os.path.normpath(exp_dir)) or exp_dir


def read_curve(exp_dir: str, metric: str = DEFAULT_METRIC) -> Curve:
    """One run's `metric` from <exp_dir>/tb: env frames, seconds since its first event, values."""
    acc = _events(exp_dir)
    if metric not in acc.Tags().get("scalars", []):
        raise PlotError(f"{exp_dir} has no '{metric}' values yet (no episode finished, or another --metric is meant).")
    return _curve(acc, metric, _run_label(exp_dir))


def read_policy_curves(exp_dir: str) -> List[Curve]:
    """Each policy's mean return of its last 100 episodes, for a run of several policies."""
    acc = _events(exp_dir)
    found = sorted((int(m.group(1)), tag) for tag in acc.Tags().get("scalars", [])
                   if (m := POLICY_METRIC.fullmatch(tag)))
    if not found:
        raise PlotError(f"{exp_dir} has no per-policy returns: it was not trained with --num_policies 2 or more, "
                        "or no episode finished yet; drop --by_policy.")
    return [_curve(acc, tag, f"{_run_label(exp_dir)} policy {k}") for k, tag in found]


def draw(curves: List[Curve], out: str, metric: str = DEFAULT_METRIC) -> None:
    """Save a two-panel figure (metric vs env frames, metric vs wall time) to `out`."""
    import matplotlib

    matplotlib.use("Agg")  # files only: works on headless machines, no display needed
    import matplotlib.pyplot as plt

    fig, (by_frames, by_time) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    longest = max(max(c.seconds) for c in curves)
    unit, scale = ("h", 3600.0) if longest > 3 * 3600 else ("min", 60.0) if longest > 180 else ("s", 1.0)
    for curve in curves:
        by_frames.plot(curve.frames, curve.values, label=curve.label)
        by_time.plot([s / scale for s in curve.seconds], curve.values, label=curve.label)
    by_frames.set_xlabel("env frames")
    by_time.set_xlabel(f"wall time ({unit})")
    by_frames.set_ylabel(metric)
    for ax in (by_frames, by_time):
        ax.grid(alpha=0.3)
    by_frames.legend(loc="best", fontsize="small")
    fig.tight_layout()
    directory = os.path.dirname(os.path.abspath(out))
    os.makedirs(directory, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def check_out(out: str) -> None:
    """Refuse an --out matplotlib cannot write (unknown or missing extension, a folder,
    an unwritable place) before any events are read."""
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    extension = os.path.splitext(out)[1].lower().lstrip(".")
    if extension not in formats:
        raise PlotError(f"--out {out} must end in an image type matplotlib writes, like .png, .pdf or .svg.")
    reason = cannot_write(out)
    if reason:
        raise PlotError(f"--out {out} cannot be written ({reason}); choose another path.")


def main(argv=None) -> int:
    parser = OneLineParser(prog="python -m fastrl.plot", description=__doc__.split("\n\n")[0],
                           allow_abbrev=False, error_name="fastrl.plot")
    parser.add_argument("experiments", nargs="+", metavar="EXP_DIR", help="Experiment folders (<train_dir>/<name>).")
    parser.add_argument("--out", default="curves.png", help="Image to write (png, pdf or svg by extension).")
    parser.add_argument("--metric", default=DEFAULT_METRIC, help="Scalar to plot, as named in TensorBoard.")
    parser.add_argument("--by_policy", action="store_true",
                        help="One line per policy of runs trained with --num_policies: each policy's mean return of "
                             "its last 100 episodes (policy_<k>/return_100); --metric is then not used.")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("matplotlib") is None:  # checked before reading any events
        print("fastrl.plot: error: plotting needs matplotlib: pip install matplotlib (or fastrl[plot]).",
              file=sys.stderr)
        return 2
    try:
        check_out(args.out)
        curves = ([c for exp in args.experiments for c in read_policy_curves(exp)] if args.by_policy
                  else [read_curve(exp, args.metric) for exp in args.experiments])
    except PlotError as err:
        print(f"fastrl.plot: error: {err}", file=sys.stderr)
        return 2
    labels = [c.label for c in curves]
    if len(set(labels)) < len(labels) and not args.by_policy:  # same name in different train dirs: tell them apart
        curves = [c._replace(label=exp) for c, exp in zip(curves, args.experiments)]
    draw(curves, args.out, "return(100) by policy" if args.by_policy else args.metric)
    print(f"fastrl.plot: wrote {args.out} ({len(curves)} run(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
