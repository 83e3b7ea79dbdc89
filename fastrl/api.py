"""fastrl's Python API: train an agent from a Config and get its summary, and load a
trained agent as a callable policy (docs/python-api.md).

    import fastrl
    summary = fastrl.train(fastrl.Config(env="CartPole-v1", train_for_env_frames=100_000))
    policy = fastrl.load_policy(summary.experiment_dir)

`train` runs `python -m fastrl.train` with the Config's options in a child process,
so a run here is exactly the command's run, and this process keeps its own torch
threads, signal handlers and CPU affinity. Importing this module imports no torch.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List, Optional, Union

from fastrl.config import Config, ConfigError, check_env_and_options, parse_args

if TYPE_CHECKING:  # for the annotations only: the policy's module imports torch
    from fastrl.policy import Policy

SUMMARY_FILE = "summary.json"
# The types a Config field may hold, by its annotation (config.py's annotations are strings).
_FIELD_TYPES = {"bool": (bool,), "int": (int,), "float": (int, float), "str": (str,),
                "Optional[float]": (int, float, type(None))}


class TrainingError(RuntimeError):
    """A training run that ended in failure or was stopped; the message says how and
    what the run printed last. exit_code: the command's exit status."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class TrainSummary:
    """What a run wrote to <experiment>/summary.json, the main fields typed; `data`
    holds every field the file has (docs/outputs.md lists them)."""

    experiment_dir: str
    env: str
    env_frames: int  # in total, a resumed run's earlier frames included
    env_frames_this_run: int
    wall_seconds: float  # from the command's launch to its end, start-up included
    fps: float  # env frames per second of this run
    episodes: int  # episodes finished in this run
    mean_return_100: Optional[float]  # mean return of the last 100 episodes; None if none finished
    mean_objective_100: Optional[float]  # the same for the env's true objective, where it reports one
    samples_trained: int
    learner_steps: int
    last_eval: Optional[dict]  # the last evaluation (with eval_every_frames), else None
    data: dict = field(repr=False)

    @classmethod
    def read(cls, experiment_dir: str) -> "TrainSummary":
        """The summary a finished run left in `experiment_dir`."""
        with open(os.path.join(experiment_dir, SUMMARY_FILE)) as fh:
            data = json.load(fh)
        return cls(experiment_dir=experiment_dir, env=data["env"], env_frames=int(data["env_frames"]),
                   env_frames_this_run=int(data["env_frames_this_run"]), wall_seconds=float(data["wall_seconds"]),
                   fps=float(data["fps"]), episodes=int(data["episodes"]), mean_return_100=data["mean_return_100"],
                   mean_objective_100=data.get("mean_objective_100"), samples_trained=int(data["samples_trained"]),
                   learner_steps=int(data["learner_steps"]), last_eval=data.get("last_eval"), data=data)


def command_line(cfg: Config) -> List[str]:
    """The options of `python -m fastrl.train` that ask for `cfg`: --env, then every
    option off its default. An option at its default is not given, so the env's preset
    applies to it, as on the command line."""
    if not isinstance(cfg, Config):
        raise TypeError(f"fastrl.train takes a fastrl.Config, not a {type(cfg).__name__}: "
                        "fastrl.train(fastrl.Config(env='CartPole-v1', ...)).")
    argv = [f"--env={cfg.env}"]
    defaults = Config()
    for f in dataclasses.fields(Config):
        value = getattr(cfg, f.name)
        kinds = _FIELD_TYPES.get(f.type)  # a field of a type not listed is left to the command's own check
        if kinds and (not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)):
            raise ConfigError(f"Config.{f.name} is {value!r}, a {type(value).__name__}, but it takes "
                              f"{' or '.join('None' if k is type(None) else k.__name__ for k in kinds)}.")
        choices = f.metadata.get("choices")
        if choices and value not in choices:
            raise ConfigError(f"Config.{f.name} is {value!r} but must be one of {', '.join(choices)}.")
        if f.name != "env" and value != getattr(defaults, f.name):
            argv.append(f"--{f.name}={_option_text(value)}")
    return argv


def _option_text(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "none"
    return repr(value) if isinstance(value, float) else str(value)


def train(cfg: Config, *, echo: bool = True) -> TrainSummary:
    """Train as `python -m fastrl.train` does with `cfg`'s options and return the run's
    summary. A bad config raises ConfigError before anything starts; a run that fails
    or is stopped raises TrainingError (its checkpoints are kept, and training `cfg`
    again resumes it). echo: copy the run's output to this process's stdout and stderr.
    Ctrl-C stops the run as it stops the command (a checkpoint is saved), then raises
    KeyboardInterrupt."""
    argv = command_line(cfg)
    resolved, _ = parse_args(argv)  # the env's presets applied, as the command applies them
    before = dataclasses.replace(resolved)
    check_env_and_options(resolved)  # bad input fails here, in one sentence, before a process starts
    # What the check recorded in the config (the modules that registered the env here), the run needs too.
    found = {f.name: getattr(resolved, f.name) for f in dataclasses.fields(Config)
             if getattr(resolved, f.name) != getattr(before, f.name)}
    if found:
        argv = command_line(dataclasses.replace(cfg, **found))
    code, last_errors = _run_command(argv, echo)
    if code == 0:
        return TrainSummary.read(resolved.experiment_dir)
    said = next((line for line in reversed(last_errors) if line.strip()), "")
    if code == 2 and said.startswith("fastrl: error: "):
        raise ConfigError(said[len("fastrl: error: "):])
    raise TrainingError(f"The training run of {resolved.experiment_dir} ended with exit status {code}"
                        + (f": {said.strip()}" if said else "."), code)


def _run_command(argv: List[str], echo: bool) -> tuple:
    """Run `python -m fastrl.train ARGV` to its end: (exit status, its last stderr lines)."""
    from fastrl.plumbing.proc import set_parent_death_signal

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # This fastrl for the child, even where it was put on sys.path by hand; after the caller's own paths.
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), root) if p)
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
    # Its own process group, so that a terminal's Ctrl-C reaches it once, forwarded from here; and
    # SIGTERM (a clean stop) should this process die first.
    proc = subprocess.Popen([sys.executable, "-m", "fastrl.train", *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=functools.partial(set_parent_death_signal, signal.SIGTERM))
    last_errors: collections.deque = collections.deque(maxlen=20)
    copiers = [threading.Thread(target=_copy_lines, args=(proc.stdout, sys.stdout if echo else None, None)),
               threading.Thread(target=_copy_lines, args=(proc.stderr, sys.stderr if echo else None, last_errors))]
    try:  # from the copiers' start: a Ctrl-C as they start is the run's too
        for copier in copiers:
            copier.start()
        code = proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        proc.wait()
        raise
    finally:
        for copier in copiers:
            if copier.ident is None:  # kept from starting by that Ctrl-C: its pipe must still be read to the end
                copier.start()
            copier.join()
    return code, list(last_errors)


def _copy_lines(stream, to, keep: Optional[collections.deque]) -> None:
    for line in stream:
        if to is not None:
            to.write(line)
            to.flush()
        if keep is not None:
            keep.append(line.rstrip("\n"))
    stream.close()


def load_policy(source: Union[str, os.PathLike], *, train_dir: str = "train_dir", checkpoint: str = "latest",
                policy: int = 0, deterministic: bool = False, device: str = "cpu", modules: str = "",
                doom_scenario: str = "") -> "Policy":
    """A trained agent as a callable Policy: `source` is an export folder (python -m
    fastrl.export), an experiment folder, or an experiment's name under `train_dir`.
    checkpoint: 'latest', 'best' or a checkpoint's path (experiments only); policy: which
    one of a --num_policies run. modules, doom_scenario: the code and scenario file its
    config names, which are imported or opened only when named here (or already imported).
    Raises AgentLoadError, in one sentence, if there is none or it names what was not given."""
    from fastrl.agent import Named, load_agent
    from fastrl.policy import Policy

    agent = load_agent(source, train_dir, checkpoint, policy, Named(modules, doom_scenario))
    return Policy(agent, deterministic=deterministic, device=device)
