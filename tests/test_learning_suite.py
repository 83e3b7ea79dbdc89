"""benchmarks/learning_suite.py: reading curves off status lines and logs, what is
computed from them, the table; and one real suite run, fastrl against SB3 PPO."""
import datetime as dt
import importlib.util
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import learning_suite as ls  # noqa: E402  (benchmarks/ is not a package)
import sb3_runner  # noqa: E402

HAS_SB3 = importlib.util.find_spec("stable_baselines3") is not None


def test_status_lines_of_fastrl_and_sb3_give_one_curve_shape():
    lines = [
        "fastrl: training CartPole-v1 with 1 rollout workers x 32 envs",
        "[    5.6s] frames 0 | 0 fps (env frames/s) | trained 0 samples/s | lag min/mean/max 0/0.0/0"
        " | return(100) nan | episodes 0 | [####......] 47% ETA 0m06s",
        "[   10.6s] frames 144,832 | 28,787 fps (env frames/s) | trained 28,087 samples/s"
        " | lag min/mean/max 3/3.0/3 | return(100) 392.94 | episodes 1,241 | objective(100) 392.94",
        sb3_runner.status_line(12.04, 25_608, 2031.2, -123.456, 174),
        "fastrl: trained for 12 s; 224,256 env frames in 12.1 s (18,497 fps), mean return(100) 259.54",
    ]
    assert ls.parse_status_lines(lines) == [[5.6, 0, None], [10.6, 144_832, 392.94], [12.0, 25_608, -123.46]]


def test_sf_log_gives_stepped_frames_and_scaled_returns():
    # SF stamps its lines in local time; the run launched 20 s before the 11:20:55 report.
    launched = dt.datetime.strptime("2026-11-23 11:20:55,392", "%Y-%m-%d %H:%M:%S,%f").timestamp() - 20.0
    lines = [
        "[2026-11-23 11:20:32,166][08312] Env info: EnvInfo(obs_space=Dict(), action_space=Discrete(4), "
        "num_agents=1, frameskip=4, reward_shaping_scheme=None)",
        "[2026-11-23 11:20:50,392][08243] Fps is (10 sec: nan, 60 sec: nan, 300 sec: nan). Total num frames: 0. "
        "Throughput: 0: nan. Samples: 0. Policy #0 lag: (min: -1.0, avg: -1.0, max: -1.0)",
        "[2026-11-23 11:20:55,392][08243] Fps is (10 sec: 0.0, 60 sec: 0.0, 300 sec: 0.0). Total num frames: 0. "
        "Throughput: 0: 465.6. Samples: 2328. Policy #0 lag: (min: -1.0, avg: -1.0, max: -1.0)",
        "[2026-11-23 11:20:55,392][08243] Avg episode reward: [(0, '-0.693')]",
    ]
    curve = ls.parse_sf_log(lines, launched, 100.0)
    assert [p[:2] for p in curve] == [[15.0, 0], [20.0, 2328 * 4]]
    assert curve[0][2] is None and curve[1][2] == pytest.approx(-69.3)


def test_tb_returns_are_the_newest_written_by_each_report():
    curve = [[5.0, 10, None], [10.0, 20, None], [15.0, 30, None]]
    events = [(1007.0, 3.0), (1010.0, 4.0), (1012.0, 5.0)]  # wall times; the run launched at 1000
    assert ls.attach_tb_returns(curve, 1000.0, events, 1.0) == [[5.0, 10, None], [10.0, 20, 4.0], [15.0, 30, 5.0]]


def test_sf_health_gathering_objective_becomes_the_game_score():
    # SF's cfg: 0.01 a tic, no death penalty; the game's: 1 a tic, -100 at death. An
    # episode of 450 tics that ends in death reads 4.5 in SF and 350 in the game.
    source, scale, offset = ls.SF_RETURN["doom_health_gathering_supreme"]
    curve = ls.attach_tb_returns([[10.0, 20, None]], 1000.0, [(1005.0, 4.5)], scale, offset)
    assert source == "tb" and curve[0][2] == pytest.approx(350.0)


def test_fastrl_curve_reads_the_game_score_when_the_reward_is_shaped():
    # health_gathering trains on the game's reward plus a pickup bonus; the curve is the
    # objective (the game's score), not the shaped return.
    line = ("[   10.6s] frames 144,832 | 8,787 fps (env frames/s) | trained 2,087 samples/s"
            " | lag min/mean/max 3/3.0/3 | return(100) 512.00 | episodes 41 | objective(100) 312.00")
    assert ls.parse_status_lines([line]) == [[10.6, 144_832, 312.0]]


@pytest.mark.parametrize("curve, target, expected", [
    ([[5.0, 0, None], [10.0, 100, 250.0], [15.0, 200, 310.0], [20.0, 300, 290.0]], 300.0, 15.0),
    ([[5.0, 0, None], [10.0, 100, 250.0]], 300.0, None),  # never reached
    ([[5.0, 0, 500.0]], None, None),  # no target for this env
    ([[5.0, 0, -900.0], [10.0, 100, -199.5], [15.0, 200, -150.0]], -200.0, 10.0),  # Pendulum: negative returns
    ([[5.0, 0, 300.0]], 300.0, 5.0),  # equal counts
])
def test_time_to_target_is_the_first_report_at_or_above_it(curve, target, expected):
    assert ls.time_to_target(curve, target) == expected


def test_at_budget_is_the_stop_report_of_a_run_that_stopped_itself():
    curve = [[5.0, 10, 1.0], [10.0, 20, 2.0], [12.5, 25, 3.0]]  # budget 10 s; SB3 stopped after an update
    kept = ls.within_budget(curve, 10.0, stopped_itself=True)
    assert kept == curve and ls.return_at_budget(kept) == 3.0
    # Signalled (SF, or a run that overran its own budget): its reports up to the budget only.
    overran = curve + [[20.0, 40, 9.0], [70.0, 90, 9.5]]
    assert ls.within_budget(overran, 10.0, stopped_itself=False) == curve[:2]
    assert ls.return_at_budget([]) is None


def test_late_return_is_the_median_of_the_last_30_s_of_reports():
    curve = [[t, 1000 * t, ret] for t, ret in [(10.0, -900.0), (50.0, -300.0), (75.0, -150.0), (80.0, None),
                                               (90.0, -600.0), (100.0, -180.0)]]
    assert ls.late_return(curve) == -180.0  # of -150, -600 and -180 (70 s on); the None is no report of a return
    assert ls.late_return(curve, window_s=5.0) == -180.0
    assert ls.late_return(curve[:1]) == -900.0
    assert ls.late_return([]) is None


def _record(system, seed, ttt, ret, frames, target=300.0, tag="", seconds=60.0):
    return {"system": system, "tag": tag, "env": "CartPole-v1", "seed": seed, "seconds": seconds, "target": target,
            "time_to_target": ttt, "return_at_budget": ret, "frames": frames, "curve": [[1.0, frames, ret]]}


def test_table_gives_medians_over_seeds_and_counts_seeds_that_reached():
    records = [_record("fastrl", 0, 8.0, 480.0, 1_000_000), _record("fastrl", 1, 12.0, 500.0, 1_200_000),
               _record("fastrl", 2, None, 200.0, 900_000),
               _record("sb3", 0, 50.0, 450.0, 100_000), _record("sb3", 1, None, 150.0, 90_000),
               _record("sb3", 2, None, None, 0),
               _record("fastrl", 0, None, -300.0, 5000, target=None, tag="lr3e-4")]
    rows = {line.split("|")[2].strip(): line for line in ls.table(records).splitlines()[2:]}
    assert rows["fastrl"].split("|")[6:11] == [" 2/3 ", " 12.0 s ", " 480.0 ", " 480.0 ", " 1,000,000 "]
    # Two of three never got there: the median is past the budget.
    assert rows["sb3"].split("|")[6:11] == [" 1/3 ", " > 60 s ", " 300.0 ", " 300.0 ", " 90,000 "]
    assert rows["fastrl (lr3e-4)"].split("|")[5:8] == [" - ", " - ", " - "]


def test_the_headline_record_gives_each_systems_medians_like_the_table():
    runs = [_record("fastrl", 0, 8.0, 480.0, 1), _record("fastrl", 1, 12.0, 500.0, 1),
            _record("fastrl", 2, None, 200.0, 1),
            _record("sb3", 0, 50.0, 450.0, 1), _record("sb3", 1, None, 150.0, 1), _record("sb3", 2, None, None, 1)]
    assert ls.headline(runs) == {
        "seeds": [0, 1, 2],
        "fastrl_time_to_target_s": 12.0, "fastrl_reached": "2/3", "fastrl_return_at_budget": 480.0,
        "sb3_time_to_target_s": None, "sb3_reached": "1/3", "sb3_return_at_budget": 300.0}
    # No target: the return at the budget alone.
    assert ls.headline([_record("sf", 0, None, 5.0, 1, target=None)]) == {"seeds": [0], "sf_return_at_budget": 5.0}


def test_a_rerun_replaces_its_older_record(tmp_path):
    path = tmp_path / "results.jsonl"
    with open(path, "w") as fh:
        for seed, ttt in ((0, 9.0), (1, 9.0), (0, 7.0)):  # seed 0 run twice, 7.0 the newer
            fh.write(json.dumps(_record("fastrl", seed, ttt, 1.0, 1)) + "\n")
    runs = sorted(ls.load_results(str(path)), key=lambda r: r["seed"])
    assert [(r["seed"], r["time_to_target"]) for r in runs] == [(0, 7.0), (1, 9.0)]


def _made_run(seed, ret, fall, tag="", commit="abc1234", date="2026-12-01 10:00:00"):
    return {**_record("fastrl", seed, None, ret, 1, target=None, tag=tag), "largest_fall": fall, "problems": [],
            "date_utc": date, "made_by": {"machine": {"cpu": "a test CPU", "cores": 2, "gpu": None}, "commit": commit},
            "suite_command": f"python benchmarks/learning_suite.py --seeds {seed}" + (f" --tag {tag}" if tag else "")}


def _write_runs(folder, *runs):
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "results.jsonl", "a") as fh:
        for r in runs:
            fh.write(json.dumps(r) + "\n")
    return str(folder)


def test_combine_records_seeds_run_in_separate_calls_as_one_figure(tmp_path, monkeypatch):
    results = tmp_path / "records"
    monkeypatch.setenv("FASTRL_BENCHMARK_RESULTS", str(results))
    folders = [_write_runs(tmp_path / "s0", _made_run(0, 100.0, 0.5), _made_run(0, 900.0, 0.1, tag="lin")),
               _write_runs(tmp_path / "s1", _made_run(1, 300.0, 0.3), _made_run(1, 700.0, 0.2, tag="lin")),
               # seed 2 twice over two folders: the newer run counts
               _write_runs(tmp_path / "s2", _made_run(2, 200.0, 0.4), _made_run(2, 1.0, 0.9, tag="lin")),
               _write_runs(tmp_path / "s2again", _made_run(2, 800.0, 0.0, tag="lin", date="2026-12-02 09:00:00"))]
    argv = ["--combine", *folders, "--out", str(tmp_path / "all")]
    monkeypatch.setattr(ls.sys, "argv", [ls.__file__, *argv])  # the command line the record names
    assert ls.main(argv) == 0
    with open(results / "learning_CartPole-v1_60s_fastrl.jsonl") as fh:
        (plain,) = [json.loads(line) for line in fh]
    with open(results / "learning_CartPole-v1_60s_fastrl_lin.jsonl") as fh:
        (lin,) = [json.loads(line) for line in fh]
    assert plain["figure"] == {"seeds": [0, 1, 2], "fastrl_return_at_budget": 200.0, "fastrl_largest_fall": 0.4}
    assert lin["figure"] == {"seeds": [0, 1, 2], "fastrl_return_at_budget": 800.0, "fastrl_largest_fall": 0.1}
    assert lin["commit"] == "abc1234" and lin["machine"]["cpu"] == "a test CPU", "where the runs were made"
    made, combined = lin["command"].rsplit(" && ", 1)
    assert made == " && ".join(f"python benchmarks/learning_suite.py --seeds {seed} --tag lin" for seed in (0, 1, 2))
    assert combined.startswith("python benchmarks/learning_suite.py --combine")
    assert plain["command"].count(" && ") == 3 and "--tag" not in plain["command"], "each record its own runs'"
    table = (tmp_path / "all" / "table.md").read_text()
    assert "| CartPole-v1 | fastrl (lin) | 60 s | 0, 1, 2 | - | - | - | 800.0 |" in table


def test_combine_refuses_runs_from_different_commits_and_missing_folders(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FASTRL_BENCHMARK_RESULTS", str(tmp_path / "records"))
    folders = [_write_runs(tmp_path / "s0", _made_run(0, 1.0, 0.0)),
               _write_runs(tmp_path / "s1", _made_run(1, 1.0, 0.0, commit="def5678"))]
    assert ls.main(["--combine", *folders, "--out", str(tmp_path / "all")]) == 2
    assert "runs of 60 s tagged '' were not all made on one machine at one commit" in capsys.readouterr().err
    assert ls.main(["--combine", str(tmp_path / "nowhere"), "--out", str(tmp_path / "all")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "records").exists(), "nothing recorded"


def test_systems_skip_envs_they_cannot_run_and_say_why():
    assert "no Doom setup" in ls.skip_reason("sb3", "doom_basic")
    assert "Doom only" in ls.skip_reason("sf", "CartPole-v1")
    assert "rl-zoo3" in ls.skip_reason("sb3", "Acrobot-v1")
    assert ls.skip_reason("sb3", "LunarLander-v3") is None
    assert ls.skip_reason("sb3", "atari_breakout") is None  # rl-zoo3's atari entry
    assert sb3_runner.ATARI_IDS["atari_breakout"] == "BreakoutNoFrameskip-v4"
    assert "Doom only" in ls.skip_reason("sf", "atari_breakout")
    assert ls.skip_reason("sf", "doom_basic") is None
    assert ls.skip_reason("fastrl", "doom_battle") is None


def test_sb3_trains_past_the_zoos_budget_only_where_no_setting_decays(tmp_path, capsys):
    # CartPole's zoo lr and clip decay to zero at n_timesteps; Pendulum's are constant.
    assert sorted(sb3_runner.scheduled_envs()) == ["CartPole-v1", "atari_breakout", "atari_pong"]
    with pytest.raises(SystemExit) as stop:
        sb3_runner.main(["--env", "CartPole-v1", "--seconds", "5", "--exp_dir", str(tmp_path), "--past_zoo_budget"])
    assert stop.value.code == 2 and "decay to zero" in capsys.readouterr().err

    class Args:
        seconds, out, report_seconds, sb3_past_zoo_budget = 60.0, str(tmp_path), 5.0, True

    assert "--past_zoo_budget" in ls.sb3_command(Args, "Pendulum-v1", 0, "Pendulum-v1_s0")


def test_missing_installs_are_named_with_their_pip_command(monkeypatch):
    class Args:
        plot = False

    monkeypatch.setattr(ls.importlib.util, "find_spec", lambda name: None)
    assert "pip install stable-baselines3" in ls.preflight(Args, [("sb3", "CartPole-v1", 0)])
    assert 'pip install "gymnasium[box2d]"' in ls.preflight(Args, [("fastrl", "LunarLander-v3", 0)])
    assert ls.preflight(Args, [("fastrl", "CartPole-v1", 0)]) is None


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SB3, reason="stable_baselines3 is not installed (pip install stable-baselines3)")
def test_suite_runs_fastrl_and_sb3_on_cartpole_end_to_end(tmp_path):
    out = tmp_path / "suite"
    proc = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "learning_suite.py"),
                           "--envs", "CartPole-v1", "--systems", "fastrl,sb3", "--seeds", "0", "--seconds", "25",
                           "--out", str(out), "--plot"],
                          cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(out / "results.jsonl") as fh:
        runs = [json.loads(line) for line in fh]
    assert sorted(r["system"] for r in runs) == ["fastrl", "sb3"]
    for r in runs:
        frames = [p[1] for p in r["curve"]]
        assert frames and frames[-1] > 0, r
        assert all(a <= b for a, b in zip(frames, frames[1:])), r
        assert all(p[0] <= 25 for p in r["curve"][:-1]) and r["stop"] == "stopped itself", r
        assert r["frames"] == frames[-1] and r["problems"] == [], r
    assert "| CartPole-v1 | fastrl | 25 s | 0 | 300 |" in proc.stdout
    assert "| CartPole-v1 | sb3 | 25 s | 0 | 300 |" in proc.stdout
    assert (out / "CartPole-v1.png").stat().st_size > 0

    # SB3's TensorBoard events are fastrl's tags: fastrl.plot reads both runs.
    from fastrl import plot

    for system in ("fastrl", "sb3"):
        curve = plot.read_curve(str(out / system / "CartPole-v1_s0"))
        assert curve.frames and curve.values


def test_sb3_on_fastrls_atari_env_sees_signed_rewards_and_whole_game_scores():
    # sb3_runner --fastrl_env: what tells an env difference from a trainer difference.
    pytest.importorskip("ale_py")
    env = sb3_runner.fastrl_atari_env("atari_breakout")
    env.reset(seed=3)
    env.action_space.seed(0)
    for _ in range(30):  # games of random play until one scores
        rewards, steps = [], 0
        while True:
            _, reward, terminated, truncated, info = env.step(env.action_space.sample())
            rewards.append(reward)
            steps += 1
            if terminated or truncated:
                env.reset()
            if "episode" in info:
                break
        assert set(rewards) <= {-1.0, 0.0, 1.0}
        if sum(rewards) > 0:
            break
    # One game over its five lives: a brick is worth 1, 4 or 7 points, each signed to 1.
    assert info["episode"]["l"] == steps and info["episode"]["r"] >= sum(rewards) > 0
    env.close()


def test_equal_frames_and_the_largest_fall_from_the_best_are_read_off_the_curve():
    curve = [[5.0, 400_000, 100.0], [10.0, 900_000, 800.0], [15.0, 1_300_000, 1000.0], [20.0, 2_000_000, 900.0]]
    assert ls.return_at_frames(curve, 1_000_000) == 1000.0  # the first report at or past it
    assert ls.return_at_frames(curve, 3_000_000) is None
    assert ls.largest_fall(curve) == pytest.approx(100.0 / 900.0)  # of the rise from 100 to 1000
    # A fall mid-run counts though the run ended at a new best: 1000 down to 400 gives back 2/3.
    dipped = [*curve[:3], [20.0, 2_000_000, 400.0], [25.0, 2_500_000, 1200.0]]
    assert ls.largest_fall(dipped) == pytest.approx(600.0 / 900.0)
    # After the best only: the dip came before the run's best (1200), which it ended at.
    assert ls.fall_after_best(dipped) == 0.0
    assert ls.fall_after_best(curve) == pytest.approx(100.0 / 900.0)
    assert ls.fall_after_best([*dipped, [30.0, 3_000_000, 650.0]]) == pytest.approx(550.0 / 1100.0)
    assert ls.fall_after_best([[5.0, 1, 100.0], [10.0, 2, 50.0]]) is None
    assert ls.largest_fall([[5.0, 1, 100.0], [10.0, 2, 50.0]]) is None  # never rose above the first report
    assert ls.largest_fall(curve[:1]) is None
    runs = [{**_record("fastrl", seed, None, 900.0, 2_000_000, target=None), "at_frames": 1_000_000,
             "return_at_frames": ret, "largest_fall": fall, "fall_after_best": fall / 2}
            for seed, (ret, fall) in enumerate([(1000.0, 0.1), (700.0, 0.5), (1200.0, 0.2)])]
    figure = ls.headline(runs)
    assert figure["fastrl_return_at_1,000,000_frames"] == 1000.0
    assert (figure["fastrl_largest_fall"], figure["fastrl_fall_after_best"]) == (0.2, 0.1)
    row = ls.table(runs).splitlines()[2]
    assert row.split("|")[11] == " 1,000 at 1,000,000 "
    assert row.split("|")[13:15] == [" 20% ", " 10% "]  # the median seed's
    older = ls.table([_record("fastrl", 0, None, 1.0, 1)]).splitlines()[2].split("|")
    assert older[13:15] == [" - ", " - "]  # a record from before these figures


EVALUATIONS = [[250_400, 800.0], [500_100, 1600.0], [1_000_160, 3200.0], [1_250_000, 2900.0]]


def _write_evaluations(out, exp, evaluations):
    """TensorBoard events as fastrl's monitor writes its evaluator's results: env frames as the step."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(out / "fastrl" / exp / "tb"))
    for frames, ret in evaluations:
        writer.add_scalar("eval/return", ret, frames)
    writer.close()


def test_the_evaluation_at_equal_frames_is_the_first_deterministic_one_at_or_past_them(tmp_path):
    _write_evaluations(tmp_path, "Hopper-v5_s0", EVALUATIONS)
    evaluations = ls.read_evaluations(str(tmp_path), "Hopper-v5_s0")
    assert evaluations == EVALUATIONS
    assert ls.evaluation_at_frames(evaluations, 1_000_000) == 3200.0
    assert ls.evaluation_at_frames(evaluations, 2_000_000) is None
    assert ls.read_evaluations(str(tmp_path), "Hopper-v5_s1") == []  # no run, or one without an evaluator
    runs = [{**_record("fastrl", seed, None, 900.0, 2_000_000, target=None), "at_frames": 1_000_000,
             "return_at_frames": 1000.0, "evaluation_at_frames": ret}
            for seed, ret in enumerate([3200.0, 700.0, None])]  # the third run made no evaluation there
    assert ls.headline(runs)["fastrl_evaluation_at_1,000,000_frames"] == pytest.approx(1950.0)
    assert ls.table(runs).splitlines()[2].split("|")[12] == " 1,950 at 1,000,000 "
    # A run without an evaluator (no record of one) leaves the column and the figure out.
    plain = [{**run, "evaluation_at_frames": None} for run in runs]
    assert "fastrl_evaluation_at_1,000,000_frames" not in ls.headline(plain)
    assert ls.table(plain).splitlines()[2].split("|")[12] == " - "


def test_combine_reads_the_evaluations_of_runs_recorded_before_the_suite_did(tmp_path, monkeypatch):
    results = tmp_path / "records"
    monkeypatch.setenv("FASTRL_BENCHMARK_RESULTS", str(results))
    older = {**_made_run(0, 100.0, 0.5), "at_frames": 1_000_000, "return_at_frames": 90.0}
    del older["suite_command"]
    folder = _write_runs(tmp_path / "s0", older)
    _write_evaluations(tmp_path / "s0", "CartPole-v1_s0", EVALUATIONS)
    assert ls.main(["--combine", folder, "--out", str(tmp_path / "all")]) == 0
    with open(results / "learning_CartPole-v1_60s_fastrl.jsonl") as fh:
        (record,) = [json.loads(line) for line in fh]
    assert record["figure"]["fastrl_evaluation_at_1,000,000_frames"] == 3200.0
    assert " && " not in record["command"], "a run that kept no command adds none"
