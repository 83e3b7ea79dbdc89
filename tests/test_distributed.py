"""Training past one process: torchrun ranks, each a whole fastrl run, whose learners
keep bit-identical weights (fastrl.plumbing.ranks, fastrl.plumbing.collectives).

The collectives are tested on two processes joined by Gloo on loopback; the whole
command under torchrun, on one machine and as two "nodes" on loopback, in the slow
tests."""
import os
import signal
import socket
import time

import gymnasium as gym
import numpy as np
import psutil
import pytest
import torch
from helpers import TrainRun, read_summary, shm_entries
from test_gradient_step import OBS, _batch, _on_policy

from fastrl.algo.model import ActorCritic, ModelSpec, RunningNorm
from fastrl.config import Config
from fastrl.learning.checkpoint import load_latest_checkpoint
from fastrl.learning.learner import _columns, gradient_step, lag_mask, start_log_ratios
from fastrl.plumbing.collectives import PeerError, Peers, weights_digest
from fastrl.plumbing.proc import start_process_server
from fastrl.plumbing.ranks import Rank, RankError, _physical_cores, core_share, detect_rank
from fastrl.plumbing.stats_board import StatsBoard

LOOPBACK = {"GLOO_SOCKET_IFNAME": "lo"}  # Gloo's traffic stays on 127.0.0.1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, port: int, result, target, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **LOOPBACK)
    torch.set_num_threads(1)
    peers = Peers(Rank(rank=rank, world_size=2, local_rank=rank, local_world_size=2), "gloo", 30.0,
                  torch.device("cpu"), StatsBoard(["learner"]).row("learner"))
    try:
        result.send(target(rank, peers, *args))
    except PeerError as err:
        result.send(err)
    finally:
        peers.leave()


def on_two_ranks(target, *args) -> list:
    """[rank 0's, rank 1's] return of target(rank, peers, *args), each run in a process
    of its own (forked from fastrl's process server, which has torch imported) that
    joined the other's process group over Gloo on loopback. Results come back on
    pipes: a multiprocessing queue would leave named semaphores in /dev/shm until
    this process exits."""
    ctx = start_process_server()
    port = _free_port()
    pipes = [ctx.Pipe(duplex=False) for _ in range(2)]
    processes = [ctx.Process(target=_rank_main, args=(r, port, pipes[r][1], target, args)) for r in range(2)]
    for p in processes:
        p.start()
    try:
        return [receive.recv() if receive.poll(120) else None for receive, _ in pipes]
    finally:
        for p in processes:
            p.join(10)
            if p.is_alive():
                p.kill()


# --------------------------------------------------------------------------------------
# Where a process stands

def test_without_torchrun_a_run_is_a_run_of_one():
    assert detect_rank({}) == Rank()
    assert not detect_rank({"WORLD_SIZE": "1", "RANK": "0"}).distributed
    rank = detect_rank({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RESTART_COUNT": "2"})
    assert (rank.rank, rank.world_size, rank.local_rank, rank.local_world_size, rank.restarts) == (3, 4, 1, 2, 2)
    assert rank.distributed and not rank.main and rank.name() == "rank 3"
    with pytest.raises(RankError, match="MASTER_ADDR, MASTER_PORT are not set; start a multi-rank run with torchrun"):
        detect_rank({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"})


def test_max_restarts_under_torchrun_is_refused_before_anything_starts(monkeypatch, capsys, tmp_path):
    # A rank cannot restart alone: its learner steps in lockstep with the others'.
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    from fastrl.train import main

    assert main(["--env", "CartPole-v1", "--train_dir", str(tmp_path), "--max_restarts", "1"]) == 2
    assert "under torchrun give torchrun --max_restarts instead" in capsys.readouterr().err
    assert not os.listdir(tmp_path)


def test_ranks_on_one_machine_split_its_physical_cores():
    # 4 cores with hyperthreads numbered 4 apart, as Linux often does: a rank takes
    # whole cores, never one thread of a core whose sibling another rank runs on.
    siblings = [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert [core_share(list(range(8)), siblings, r, 2) for r in range(2)] == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert [core_share(list(range(8)), siblings, r, 3) for r in range(3)] == [[0, 4], [1, 5], [2, 3, 6, 7]]
    # Fewer cores than ranks: single threads, then a shared cpu each.
    assert [core_share([0, 1], [[0, 1]], r, 2) for r in range(2)] == [[0], [1]]
    assert [core_share([0, 1], [[0], [1]], r, 3) for r in range(3)] == [[0], [1], [0]]


def test_physical_cores_are_read_from_sysfs_and_guessed_where_it_is_silent(tmp_path):
    for cpu, core in [(0, 0), (1, 1), (2, 0), (3, 1)]:  # two cores, hyperthreads numbered 2 apart
        (tmp_path / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (tmp_path / f"cpu{cpu}" / "topology" / "physical_package_id").write_text("0\n")
        (tmp_path / f"cpu{cpu}" / "topology" / "core_id").write_text(f"{core}\n")
    assert _physical_cores([0, 1, 2, 3], str(tmp_path)) == [[0, 2], [1, 3]]
    assert _physical_cores([0, 7], str(tmp_path)) == [[0], [7]]  # cpu 7 has no topology: a core of its own


# --------------------------------------------------------------------------------------
# The collectives, on two processes

def _gradient_on(rank, peers, batch, valid, columns):
    torch.manual_seed(0)
    model = ActorCritic(OBS, gym.spaces.Discrete(2), ModelSpec(hidden_sizes=(8,)))
    cfg = Config(env="CartPole-v1", max_grad_norm=0.0, normalize_advantages=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the step leaves .grad to read
    gradient_step(cfg, model, optimizer, _columns(batch, columns[rank]), valid[:, columns[rank]], peers)
    return [p.grad.numpy().copy() for p in model.parameters()]


def test_the_all_reduced_gradient_is_that_of_every_ranks_samples_at_once():
    # Rank 0 trains on columns 0-2, rank 1 on 3-5, where lag drops two of its columns:
    # weighted by valid samples, their mean gradient is the gradient of one step over
    # all six columns (as advantages are not normalised per minibatch here).
    torch.manual_seed(0)
    model = ActorCritic(OBS, gym.spaces.Discrete(2), ModelSpec(hidden_sizes=(8,)))
    batch = _on_policy(model, _batch())
    batch["policy_version"][:, 4:] = -30
    _, valid = lag_mask(0, batch["policy_version"], 25)
    columns = [torch.arange(0, 3), torch.arange(3, 6)]
    grads0, grads1 = on_two_ranks(_gradient_on, batch, valid, columns)

    cfg = Config(env="CartPole-v1", max_grad_norm=0.0, normalize_advantages=False)
    gradient_step(cfg, model, torch.optim.SGD(model.parameters(), lr=0.0), batch, valid)
    for g0, g1, whole in zip(grads0, grads1, model.parameters()):
        assert np.array_equal(g0, g1)  # bit-identical on both ranks
        np.testing.assert_allclose(g0, whole.grad.numpy(), rtol=1e-5, atol=1e-7)


def _return_norm_on(rank, peers, batch, valid, columns):
    torch.manual_seed(0)
    model = ActorCritic(OBS, gym.spaces.Discrete(2), ModelSpec(hidden_sizes=(8,), normalize_returns=True))
    cfg = Config(env="CartPole-v1", max_grad_norm=0.0)
    gradient_step(cfg, model, torch.optim.SGD(model.parameters(), lr=0.0), _columns(batch, columns[rank]),
                  valid[:, columns[rank]], peers)
    norm = model.return_norm
    return float(norm.mean), float(norm.var), float(norm.count)


def test_the_return_normaliser_takes_in_every_ranks_targets_with_the_gradient():
    # The moments ride behind the gradient in its all-reduce (one collective a step,
    # not two): both ranks end with the statistics of every rank's valid targets.
    torch.manual_seed(0)
    model = ActorCritic(OBS, gym.spaces.Discrete(2), ModelSpec(hidden_sizes=(8,), normalize_returns=True))
    batch = _on_policy(model, _batch())
    batch["policy_version"][:, 4:] = -30
    _, valid = lag_mask(0, batch["policy_version"], 25)
    columns = [torch.arange(0, 3), torch.arange(3, 6)]
    rank0, rank1 = on_two_ranks(_return_norm_on, batch, valid, columns)
    assert rank0 == rank1  # bit-identical

    out, _ = gradient_step(Config(env="CartPole-v1", max_grad_norm=0.0), model,
                           torch.optim.SGD(model.parameters(), lr=0.0), batch, valid)
    alone = RunningNorm(())
    alone.update(out.vs_tm1[valid > 0])
    assert rank0[2] == float(alone.count) == float(valid.sum())
    np.testing.assert_allclose(rank0[:2], [float(alone.mean), float(alone.var)], rtol=1e-5)


def _skip_on(rank, peers, batch):
    torch.manual_seed(0)
    model = ActorCritic(OBS, gym.spaces.Discrete(2), ModelSpec(hidden_sizes=(8,)))
    before = [p.detach().clone() for p in model.parameters()]
    batch = _on_policy(model, batch)
    if rank == 1:
        batch["rewards"][0, 0] = float("nan")  # only rank 1's loss is not finite
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    out, _ = gradient_step(Config(env="CartPole-v1"), model, optimizer, batch, torch.ones(5, 6), peers)
    unchanged = all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    return out is None, unchanged


def test_a_step_skipped_on_one_rank_is_skipped_on_every_rank():
    assert on_two_ranks(_skip_on, _batch()) == [(True, True), (True, True)]


def _kl_bound_on(rank, peers, batch):
    torch.manual_seed(0)
    model = ActorCritic(OBS, gym.spaces.Discrete(2), ModelSpec(hidden_sizes=(8,)))
    before = [p.detach().clone() for p in model.parameters()]
    batch = _on_policy(model, batch)
    batch["start_log_ratio"] = start_log_ratios(model, batch)  # rank 0: at the batch's start, KL 0
    if rank == 1:
        batch["start_log_ratio"] += 1.0  # rank 1's policy has moved: KL e^-1 - 1 + 1 = 0.37
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    _, grad_norm = gradient_step(Config(env="CartPole-v1", target_kl=0.01), model, optimizer, batch,
                                 torch.ones(5, 6), peers)
    unchanged = all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    return grad_norm is None, unchanged


def test_a_step_refused_by_the_kl_bound_on_one_rank_is_refused_on_every_rank():
    assert on_two_ranks(_kl_bound_on, _batch()) == [(True, True), (True, True)]


def _normalise_on(rank, peers, batches):
    norm = RunningNorm((2,))
    for batch in batches[rank]:
        norm.update(batch, peers.sum_)
    return norm.mean.tolist(), norm.var.tolist(), float(norm.count)


def test_the_normalisers_take_in_every_ranks_batch():
    g = torch.Generator().manual_seed(0)
    data = [torch.randn(n, 2, generator=g) * 3 + 5 for n in (7, 13, 0, 4)]
    # Each update: rank 0's batch with rank 1's; rank 0 has nothing the second time.
    batches = [[data[0], data[2]], [data[1], data[3]]]
    rank0, rank1 = on_two_ranks(_normalise_on, batches)
    assert rank0 == rank1
    alone = RunningNorm((2,))
    alone.update(torch.cat([data[0], data[1]]))
    alone.update(torch.cat([data[2], data[3]]))
    np.testing.assert_allclose(rank0[0], alone.mean.tolist(), rtol=1e-6)
    np.testing.assert_allclose(rank0[1], alone.var.tolist(), rtol=1e-5)
    assert rank0[2] == 24
    all_rows = torch.cat(data).double()
    np.testing.assert_allclose(rank0[0], all_rows.mean(0).tolist(), rtol=1e-6)
    np.testing.assert_allclose(rank0[1], all_rows.var(0, unbiased=False).tolist(), rtol=1e-5)


def _agree_on(rank, peers):
    first = peers.agree(stop=False, counts=torch.tensor([10.0 + rank, 1.0]))
    second = peers.agree(stop=rank == 1, counts=torch.tensor([20.0, 2.0]))
    return [(stop, counts.tolist()) for stop, counts in (first, second)]


def test_a_stop_asked_by_one_rank_is_agreed_by_every_rank_with_the_counters_summed():
    expected = [(False, [21.0, 2.0]), (True, [40.0, 4.0])]
    assert on_two_ranks(_agree_on) == [expected, expected]


class _SliceEndsAsTheWorkCompletes:
    """A collective whose first timed wait runs out ("Operation timed out!", as c10d
    says it) and which is complete by the time anyone asks: the race a sliced wait
    meets when the work finishes at the end of a slice."""

    def __init__(self, error=None):
        self.error, self.waits = error, []

    def wait(self, timeout=None):
        self.waits.append(timeout)
        if len(self.waits) == 1:  # the slice that ran out; by the next call it is complete
            raise RuntimeError("Operation timed out!")
        if self.error is not None:
            raise self.error
        return True

    def is_completed(self):
        return True


def test_a_slice_that_runs_out_as_the_collective_completes_is_not_an_error():
    # Re-raising the slice's timeout there stopped 2 of 6 two-rank doom_battle runs:
    # the rank left an all-reduce that had succeeded, its peer went on to the next.
    from fastrl.plumbing.collectives import _wait_taking_signals

    done = _SliceEndsAsTheWorkCompletes()
    _wait_taking_signals(done)
    assert len(done.waits) == 2  # the outcome came from the completed work itself
    failed = _SliceEndsAsTheWorkCompletes(RuntimeError("Connection closed by peer"))
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        _wait_taking_signals(failed)


class _Signalled(BaseException):
    """What the learner's SIGTERM handler raises (fastrl.plumbing.proc.Interrupted)."""


def _leave_a_collective_on(rank, peers, left_marker):
    """Rank 1 is signalled out of an all-reduce that rank 0 never joins, and leaves;
    rank 0 says whether rank 1 got out while rank 0 was still there."""
    if rank == 0:
        deadline = time.time() + 20  # under the group's 30-s timeout, which would end the wait anyway
        while not os.path.exists(left_marker) and time.time() < deadline:
            time.sleep(0.05)
        return os.path.exists(left_marker)

    def interrupt(signum, frame):
        raise _Signalled()

    signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        peers.agree(stop=False, counts=torch.tensor([1.0]))
    except _Signalled:
        pass
    peers.leave()
    open(left_marker, "w").close()
    return True


def test_a_rank_signalled_out_of_a_collective_leaves_without_waiting_for_it(tmp_path):
    # Destroying the group waited for the abandoned all-reduce until the peer went or
    # the timeout ran out: a learner that torchrun's SIGTERM reached there outlived its rank.
    assert on_two_ranks(_leave_a_collective_on, str(tmp_path / "left")) == [True, True]


def _refuse_pickles(*args, **kwargs):
    raise AssertionError("ranks must exchange fixed-size tensors, never pickles")


def _check_on(rank, peers, values):
    torch.distributed.all_gather_object = torch.distributed.broadcast_object_list = _refuse_pickles
    peers.check_agreement({"model size": 100, **values[rank]}, {"resumed policy version": "same folder."},
                          "same command.")


def test_ranks_that_differ_are_refused_naming_the_rank_and_the_difference():
    resumed = [{"resumed policy version": 3, "--lr": 0.001}, {"resumed policy version": 5, "--lr": 0.001}]
    options = [{"resumed policy version": 3, "--lr": 0.001}, {"resumed policy version": 3, "--lr": 0.01}]
    for values, sentence in [(resumed, "rank 1's resumed policy version is 5 but rank 0's is 3; same folder."),
                             (options, "rank 1's --lr is 0.01 but rank 0's is 0.001; same command.")]:
        for err in on_two_ranks(_check_on, values):
            assert isinstance(err, PeerError) and str(err) == sentence
    # Another fastrl on one rank checks another set of values: refused, not hung.
    newer = [{"--lr": 0.001}, {"--lr": 0.001, "--new_option": 1}]
    for err in on_two_ranks(_check_on, newer):
        assert isinstance(err, PeerError) and str(err) == (
            "rank 1 checks 3 values at start-up but rank 0 checks 2: install one fastrl version on every machine.")
    assert on_two_ranks(_check_on, [{"--lr": 0.001}] * 2) == [None, None]


def _digests_on(rank, peers):
    torch.distributed.all_gather_object = _refuse_pickles
    model = torch.nn.Linear(3, 2)
    torch.nn.init.constant_(model.weight, float(rank))
    return peers.weights_digests(model), weights_digest(model)


def test_weights_digests_come_back_in_rank_order():
    (digests0, own0), (digests1, own1) = on_two_ranks(_digests_on)
    assert digests0 == digests1 == [own0, own1] and own0 != own1


# --------------------------------------------------------------------------------------
# The command under torchrun

FAST = ["-m", "fastrl.train", "--env", "CartPole-v1", "--status_every_seconds", "2"]


def torchrun(launch: list, args: list) -> TrainRun:
    return TrainRun([*launch, *FAST, *args], module="torch.distributed.run", env=LOOPBACK)


def _weights(summary: dict) -> list:
    return summary["ranks"]["weights_sha256_by_rank"]


def assert_nothing_left(run: TrainRun) -> None:
    """No process of the launch alive, and no /dev/shm entry of its own. /dev/shm is
    shared with whatever else runs here: CartPole starts no Doom game, so ViZDoom
    segments are others', torch's segments name the process that made them
    (torch_<pid>_...), and an entry gone a second later was another process's shared
    tensor caught between its creation and its unlink."""
    assert run.leftover_processes() == [], run.output()
    ours = {str(pid) for pid in run.descendants | {run.proc.pid}}
    new = {e for e in run.new_shm_entries()
           if not e.startswith("ViZDoom") and (not e.startswith("torch_") or e.split("_")[1] in ours)}
    if new:
        time.sleep(1.0)
        new &= shm_entries()
    assert new == set()


def _experiment_files(folder) -> set:
    return {os.path.relpath(os.path.join(d, f), folder) for d, _, files in os.walk(folder) for f in files
            if not f.startswith("events.out.tfevents")}


# This and the killed learner below run in the fast suite (7-9 s each on 2 cores): a
# multi-rank run's main path and its fault path, which CI would otherwise never start.
def test_two_ranks_on_one_machine_learn_with_identical_weights(tmp_path):
    # Each rank gets one of this machine's two cores; the batch is per rank.
    run = torchrun(["--standalone", "--nproc_per_node", "2"],
                   ["--train_dir", str(tmp_path), "--stop_at_reward", "100", "--train_for_env_frames", "400000"])
    assert run.wait(timeout=240) == 0, run.output()
    summary = read_summary(tmp_path, "CartPole-v1")
    assert summary["reached_reward_mean_100"] >= 100, run.output()
    assert summary["ranks"]["world_size"] == 2 and len(set(_weights(summary))) == 1, summary
    assert "on 2 ranks" in run.output() and "2,048 samples per gradient step in all" in run.output()
    # Rank 0 reports for the run; rank 1 prints nothing and writes nothing.
    assert sum(line.startswith("fastrl: plan:") for line in run.lines) == 1, run.output()
    # The closing rate beside the plan is rank 0's own, where the status line sums the ranks.
    assert any(line.startswith("fastrl: rank 0: planned ") for line in run.lines), run.output()
    files = _experiment_files(tmp_path / "CartPole-v1")
    assert {"config.json", "plan.json", "summary.json"} <= files
    assert len(os.listdir(tmp_path / "CartPole-v1" / "checkpoints")) == 1, files
    assert len(os.listdir(tmp_path / "CartPole-v1" / "tb")) == 1
    assert_nothing_left(run)


@pytest.mark.slow
def test_two_nodes_on_loopback_train_as_one(tmp_path):
    # The c10d rendezvous numbers the ranks in the order the nodes join (it ignores
    # --node_rank), so either node's may be rank 0: the one that prints the status.
    port = _free_port()
    nodes = [torchrun(["--nnodes", "2", "--nproc_per_node", "1", "--node_rank", str(node), "--rdzv_backend", "c10d",
                       "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "loopback"],
                      ["--train_dir", str(tmp_path), "--plan", "off", "--num_envs_per_worker", "16",
                       "--stop_at_reward", "60", "--train_for_env_frames", "400000"])
             for node in range(2)]
    codes = [node.wait(timeout=180) for node in nodes]
    assert codes == [0, 0], "\n---\n".join(node.output() for node in nodes)
    summary = read_summary(tmp_path, "CartPole-v1")
    assert summary["reached_reward_mean_100"] >= 60 and len(set(_weights(summary))) == 1, summary
    assert len(os.listdir(tmp_path / "CartPole-v1" / "checkpoints")) == 1
    assert [any(line.startswith("[") for line in node.lines) for node in nodes].count(True) == 1
    for node in nodes:
        assert_nothing_left(node)


def _learner_of_rank(run: TrainRun, rank: int) -> psutil.Process:
    """The learner process of torchrun rank `rank`: the one under the runner that
    torchrun gave that RANK (the learner's own environment cannot be read: setting
    its title overwrote it)."""
    for runner in psutil.Process(run.proc.pid).children():
        if runner.environ().get("RANK") == str(rank):
            for child in runner.children(recursive=True):
                if " ".join(child.cmdline()).strip() == "fastrl: learner":
                    return child
    raise AssertionError(f"no learner of rank {rank} found:\n" + run.output())


def test_a_killed_learner_stops_every_rank_naming_it(tmp_path):
    run = torchrun(["--standalone", "--nproc_per_node", "2"], ["--train_dir", str(tmp_path)])
    try:
        run.wait_for_line(lambda line: line.startswith("[") and "trained 0 samples/s" not in line, timeout=120)
        _learner_of_rank(run, 1).send_signal(signal.SIGKILL)
        killed_at = time.time()
        assert run.wait(timeout=60) != 0, run.output()
    finally:
        run.kill_all()
    assert time.time() - killed_at < 30, run.output()
    # Rank 1 names its learner's death; rank 0 either lost it in a collective or was
    # stopped first by torchrun, which ends the other ranks once one has failed.
    assert "fastrl: rank 1: learner" in run.output() and "was killed by SIGKILL" in run.output(), run.output()
    assert_nothing_left(run)


@pytest.mark.slow
def test_a_stopped_learner_goes_when_torchrun_ends_its_rank(tmp_path):
    # As found in chaos runs: rank 1's learner frozen by SIGSTOP, and rank 0's
    # learner killed, so torchrun ends rank 1 (SIGTERM, then SIGKILL if it lingers).
    # The frozen learner was left behind, orphaned in state T.
    run = torchrun(["--standalone", "--nproc_per_node", "2"], ["--train_dir", str(tmp_path)])
    try:
        run.wait_for_line(lambda line: line.startswith("[") and "trained 0 samples/s" not in line, timeout=120)
        frozen = _learner_of_rank(run, 1)
        frozen.send_signal(signal.SIGSTOP)
        deadline = time.time() + 10
        while frozen.status() != psutil.STATUS_STOPPED:
            assert time.time() < deadline, "rank 1's learner was not stopped 10 s after SIGSTOP"
            time.sleep(0.05)
        _learner_of_rank(run, 0).send_signal(signal.SIGKILL)
        assert run.wait(timeout=120) != 0, run.output()
        left = run.leftover_processes(grace=30)
    finally:
        run.kill_all()
    assert left == [], run.output()
    assert_nothing_left(run)


@pytest.mark.slow
def test_torchrun_restarts_every_rank_from_rank_0s_checkpoint(tmp_path):
    # A killed learner fails its rank; torchrun (--max_restarts 1) restarts both, and
    # they resume from the checkpoint rank 0's learner wrote as the run stopped.
    run = torchrun(["--standalone", "--nproc_per_node", "2", "--max_restarts", "1"],
                   ["--train_dir", str(tmp_path), "--train_for_env_frames", "80000"])
    try:
        run.wait_for_line(lambda line: line.startswith("[") and "trained 0 samples/s" not in line, timeout=120)
        _learner_of_rank(run, 1).send_signal(signal.SIGKILL)
        assert run.wait(timeout=180) == 0, run.output()
    finally:
        run.kill_all()
    assert "fastrl: rank 1: learner" in run.output() and "was killed by SIGKILL" in run.output(), run.output()
    summary = read_summary(tmp_path, "CartPole-v1")
    resumed_at = summary["env_frames"] - summary["env_frames_this_run"]
    assert resumed_at > 0 and summary["env_frames"] >= 80000, summary
    assert len(set(_weights(summary))) == 1, summary
    state, _ = load_latest_checkpoint(str(tmp_path / "CartPole-v1" / "checkpoints"))
    assert state["env_frames"] >= 80000 and max(int(s["step"]) for s in state["optimizer"]["state"].values()) > 0
    assert_nothing_left(run)
