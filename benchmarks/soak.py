"""Soak test: train for a long time and watch memory. Leaks show up as private
memory (USS) or /dev/shm that keeps growing after warm-up; a trainer meant to run for days must
stay flat.

    python benchmarks/soak.py                          # 30 min CartPole-v1, then 30 min doom_basic
    python benchmarks/soak.py --env doom_basic --minutes 60
    python benchmarks/soak.py --minutes 1 --sample_every 10   # a smoke run of this script
    python benchmarks/soak.py --env CartPole-v1 -- --num_workers 2   # options after -- go to fastrl.train

Every --sample_every seconds it records, for every process of the run (the
runner and all its descendants: learner, workers, ViZDoom engines, ...), the
resident set size (RSS) and unique set size (USS, memory only that process
holds), grouped by process title, and the run's shared memory: the /dev/shm
objects its processes map (unlinked ones included: they hold memory until
unmapped) and the /dev/shm entries that appeared since it started. It prints a
table of RSS, judges each group's USS "flat after warm-up" (growth from the first sample
after --warmup_minutes to the last below --max_growth_pct percent or
--max_growth_mb MB per process, whichever is larger; shared memory must not grow
at all), writes everything to --json and records each env's verdict in
benchmarks/results/soak_<env>_<minutes>min.jsonl.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

import psutil
import records

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MB = 1024 * 1024


def group_of(proc: psutil.Process, runner_pid: int) -> str:
    if proc.pid == runner_pid:
        return "runner"
    try:
        cmd = " ".join(proc.cmdline()).strip()
    except psutil.Error:
        return "?"
    if cmd.startswith("fastrl:"):
        return cmd
    if "forkserver" in cmd:
        return "process server"
    if "resource_tracker" in cmd:
        return "resource tracker"
    return os.path.basename(cmd.split()[0]) if cmd else proc.name()


def shm_mapped(pids: list) -> dict:
    """{(path, inode): bytes} of the /dev/shm objects mapped by these processes."""
    objects: dict = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as fh:
                lines = fh.readlines()
        except OSError:
            continue
        for line in lines:
            parts = line.split(None, 5)
            if len(parts) < 6 or not parts[5].startswith("/dev/shm/"):
                continue
            start, end = (int(x, 16) for x in parts[0].split("-"))
            key = (parts[5].strip(), parts[4])
            objects[key] = max(objects.get(key, 0), int(parts[2], 16) + end - start)
    return objects


def shm_dir() -> dict:
    out = {}
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return out
    for name in names:
        try:
            st = os.stat(os.path.join("/dev/shm", name))
            out[name] = st.st_blocks * 512
        except OSError:
            pass
    return out


def sample(runner: psutil.Process, shm_before: set, elapsed: float) -> dict:
    procs = [runner]
    try:
        procs += runner.children(recursive=True)
    except psutil.Error:
        pass
    groups: dict = {}
    for p in procs:
        try:
            mem = p.memory_full_info()
        except psutil.Error:
            continue
        g = groups.setdefault(group_of(p, runner.pid), {"procs": 0, "rss_mb": 0.0, "uss_mb": 0.0})
        g["procs"] += 1
        g["rss_mb"] += mem.rss / MB
        g["uss_mb"] += mem.uss / MB
    mapped = shm_mapped([p.pid for p in procs])
    now = shm_dir()
    new = {k: v for k, v in now.items() if k not in shm_before}
    return {
        "seconds": round(elapsed, 1),
        "groups": groups,
        "total_rss_mb": sum(g["rss_mb"] for g in groups.values()),
        "total_uss_mb": sum(g["uss_mb"] for g in groups.values()),
        "processes": sum(g["procs"] for g in groups.values()),
        "shm_mapped_objects": len(mapped),
        "shm_mapped_mb": sum(mapped.values()) / MB,
        "shm_new_entries": len(new),
        "shm_new_mb": sum(new.values()) / MB,
    }


def _median_sample(samples: list) -> dict:
    """Per field, the median over a few samples: one sample can catch a learner
    mid-batch with tens of MB of temporaries, which is not a trend."""
    def med(values):
        values = sorted(values)
        return values[len(values) // 2]

    names = set.intersection(*(set(s["groups"]) for s in samples))
    groups = {n: {k: med([s["groups"][n][k] for s in samples]) for k in ("procs", "rss_mb", "uss_mb")} for n in names}
    out = {k: med([s[k] for s in samples]) for k in samples[0] if k != "groups"}
    out["groups"] = groups
    return out


def judge(samples: list, warmup_s: float, max_pct: float, max_mb: float) -> dict:
    after = [s for s in samples if s["seconds"] >= warmup_s]
    if len(after) < 2:
        return {"flat": None, "why": f"fewer than two samples after the {warmup_s:g} s warm-up"}
    # Each end is the median of a quarter of the samples after warm-up (3 at least):
    # a learner's private memory swings by +-150 MB with its batch temporaries
    # (doom_battle, 2 hours), so three samples a side judged that swing, not a trend.
    k = min(max(3, len(after) // 4), len(after) // 2)
    first, last = _median_sample(after[:k]), _median_sample(after[-k:])
    checks = {}
    missing = sorted(set(first["groups"]) ^ set(last["groups"]))
    # Judged on USS, the memory only that process holds. RSS also counts shared pages
    # the first time a process touches them: a rollout worker handed buffer indices
    # it never had before, or mapping its games' screen segments, grows in RSS by
    # tens of MB (measured on doom_basic) while its private memory stays flat.
    def memory_check(a: dict, b: dict, procs: int) -> dict:
        allowed = max(a["uss_mb"] * max_pct / 100.0, max_mb * procs)
        growth = b["uss_mb"] - a["uss_mb"]
        return {"uss_mb_from": round(a["uss_mb"], 1), "uss_mb_to": round(b["uss_mb"], 1),
                "rss_mb_from": round(a["rss_mb"], 1), "rss_mb_to": round(b["rss_mb"], 1),
                "growth_mb": round(growth, 1), "allowed_mb": round(allowed, 1), "flat": growth <= allowed}

    for name in sorted(set(first["groups"]) & set(last["groups"])):
        a, b = first["groups"][name], last["groups"][name]
        checks[name] = memory_check(a, b, max(a["procs"], b["procs"]))
    totals = [{"uss_mb": s["total_uss_mb"], "rss_mb": s["total_rss_mb"]} for s in (first, last)]
    checks["all processes"] = memory_check(*totals, first["processes"])
    shm_growth = (last["shm_mapped_objects"] - first["shm_mapped_objects"],
                  last["shm_mapped_mb"] - first["shm_mapped_mb"])
    checks["shared memory"] = {"objects_from": first["shm_mapped_objects"], "objects_to": last["shm_mapped_objects"],
                               "mb_from": round(first["shm_mapped_mb"], 2), "mb_to": round(last["shm_mapped_mb"], 2),
                               "flat": shm_growth[0] <= 0 and shm_growth[1] <= 0.01}
    # A group seen at one end only is a process that started or died after warm-up
    # (a restarted worker keeps its title, so it is not one): nothing to compare.
    return {"flat": all(c["flat"] for c in checks.values()) and not missing, "from_seconds": after[0]["seconds"],
            "to_seconds": after[-1]["seconds"], "medians_of_samples": k, "checks": checks,
            "groups_at_one_end_only": missing}


def print_table(env: str, samples: list) -> None:
    names = sorted({n for s in samples for n in s["groups"]}, key=lambda n: (not n.startswith("fastrl"), n))
    short = [re.sub(r"^fastrl: (rollout|policy)-worker", r"\1", n).replace("fastrl: ", "") for n in names]
    print(f"\n{env}: RSS in MB per process group (sum over its processes), shared memory of the run")
    header = (f"{'min':>6} " + " ".join(f"{s[:14]:>14}" for s in short)
              + f" {'total':>9} {'shm obj':>8} {'shm MB':>8} {'new /dev/shm':>13}")
    print(header)
    for s in samples:
        cells = " ".join(f"{s['groups'][n]['rss_mb']:>14.1f}" if n in s["groups"] else f"{'-':>14}" for n in names)
        print(f"{s['seconds'] / 60:>6.1f} {cells} {s['total_rss_mb']:>9.1f} {s['shm_mapped_objects']:>8d} "
              f"{s['shm_mapped_mb']:>8.1f} {s['shm_new_entries']:>13d}")


def print_verdict(verdict: dict) -> str:
    """Print each check of a judge() verdict; the verdict in a word or two."""
    for name, c in verdict.get("checks", {}).items():
        if "growth_mb" in c:
            print(f"  {'flat ' if c['flat'] else 'GROWS'} {name}: "
                  f"USS {c['uss_mb_from']:.1f} -> {c['uss_mb_to']:.1f} MB "
                  f"(growth {c['growth_mb']:+.1f}, allowed {c['allowed_mb']:.1f}; RSS {c['rss_mb_from']:.1f} -> "
                  f"{c['rss_mb_to']:.1f})")
        else:
            print(f"  {'flat ' if c['flat'] else 'GROWS'} {name}: {c['objects_from']} -> {c['objects_to']} objects, "
                  f"{c['mb_from']:.2f} -> {c['mb_to']:.2f} MB")
    if verdict.get("groups_at_one_end_only"):
        print(f"  GROWS? processes present at one end only: {', '.join(verdict['groups_at_one_end_only'])}")
    return "FLAT" if verdict["flat"] else "NOT FLAT" if verdict["flat"] is False else "NO VERDICT"


def soak(env: str, args, extra: list, out_dir: str) -> dict:
    duration = args.minutes * 60.0
    warmup = args.warmup_minutes * 60.0
    if warmup >= duration:
        warmup = duration / 2
        print(f"soak: the run is shorter than the warm-up; judging from {warmup:g} s instead", flush=True)
    log_path = os.path.join(out_dir, f"{env.replace(':', '_')}.log")
    # Training outlasts the last sample by half an interval, so no sample catches the shutdown.
    train_seconds = duration + min(30.0, args.sample_every / 2)
    cmd = [sys.executable, "-m", "fastrl.train", "--env", env, "--train_dir", out_dir,
           "--experiment", f"soak_{env.replace(':', '_')}", "--restart", "--train_for_seconds", f"{train_seconds:g}",
           "--status_every_seconds", "60", *extra]
    shm_before = set(shm_dir())
    print(f"soak: {' '.join(cmd[1:])}\nsoak: console output in {log_path}", flush=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    runner = psutil.Process(proc.pid)
    start = time.time()
    samples, seen = [], set()
    next_at = start + args.sample_every
    try:
        while proc.poll() is None:
            time.sleep(max(0.0, min(next_at - time.time(), 1.0)))
            try:
                seen.update(c.pid for c in runner.children(recursive=True))
            except psutil.Error:
                pass
            if time.time() >= next_at and time.time() - start <= duration + 1 and proc.poll() is None:
                s = sample(runner, shm_before, time.time() - start)
                samples.append(s)
                print(f"soak: {env} at {s['seconds'] / 60:5.1f} min: {s['processes']} processes, "
                      f"RSS {s['total_rss_mb']:.0f} MB (USS {s['total_uss_mb']:.0f}), "
                      f"shm {s['shm_mapped_objects']} objects {s['shm_mapped_mb']:.1f} MB, "
                      f"{s['shm_new_entries']} new /dev/shm entries", flush=True)
                next_at += args.sample_every
            if time.time() - start > duration + 300:
                print("soak: the run overstayed its time by 5 minutes; stopping it", flush=True)
                os.killpg(proc.pid, 2)
                proc.wait(60)
    except KeyboardInterrupt:
        os.killpg(proc.pid, 2)
        proc.wait(60)
    code = proc.wait()
    time.sleep(3)
    left = [p for p in seen if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    leaked = sorted(set(shm_dir()) - shm_before)
    print_table(env, samples)
    verdict = judge(samples, warmup, args.max_growth_pct, args.max_growth_mb)
    judged = print_verdict(verdict)
    span = "from %.1f to %.1f min" % (verdict.get("from_seconds", 0) / 60, verdict.get("to_seconds", 0) / 60)
    print(f"{env}: exit code {code}; {judged} after warm-up ({verdict.get('why', span)});"
          f" {len(left)} processes left behind, {len(leaked)} new /dev/shm entries after exit"
          " (may include other runs')", flush=True)
    with open(log_path) as fh:
        tail = fh.read().splitlines()[-20:]
    return {"env": env, "command": cmd, "exit_code": code, "samples": samples, "verdict": verdict,
            "left_behind": left, "new_shm_entries_after_exit": leaked, "log_tail": tail}


def rejudge(args) -> int:
    with open(args.rejudge) as fh:
        report = json.load(fh)
    ok = True
    for run in report["runs"]:
        verdict = judge(run["samples"], args.warmup_minutes * 60.0, args.max_growth_pct, args.max_growth_mb)
        judged = print_verdict(verdict)
        how = verdict.get("why") or f"each end the median of {verdict.get('medians_of_samples')} samples"
        print(f"{run['env']}: {judged} after warm-up ({how})")
        ok = ok and bool(verdict["flat"])
    return 0 if ok else 1


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="both",
                        help="CartPole-v1, doom_basic, any fastrl env, or both (the two in turn)")
    parser.add_argument("--minutes", type=float, default=30.0, help="training time per env")
    parser.add_argument("--sample_every", type=float, default=60.0, help="seconds between samples")
    parser.add_argument("--warmup_minutes", type=float, default=3.0, help="growth before this is not judged")
    parser.add_argument("--max_growth_pct", type=float, default=5.0)
    parser.add_argument("--max_growth_mb", type=float, default=5.0, help="per process")
    parser.add_argument("--json", default=os.path.join(REPO, "benchmarks", "soak_result.json"))
    parser.add_argument("--train_dir", default="", help="where runs go (default: a temporary folder, deleted after)")
    parser.add_argument("--rejudge", default="", help="judge the samples of an earlier run's --json file again "
                        "(with this version's judge and --warmup_minutes and growth limits) instead of running")
    args = parser.parse_args(argv)
    if args.rejudge:
        return rejudge(args)

    envs = ["CartPole-v1", "doom_basic"] if args.env == "both" else [args.env]
    tmp = None if args.train_dir else tempfile.TemporaryDirectory(prefix="fastrl_soak_")
    out_dir = args.train_dir or tmp.name
    os.makedirs(out_dir, exist_ok=True)
    results = []
    try:
        for env in envs:
            results.append(soak(env, args, extra, out_dir))
    finally:
        report = {"machine": {"cpu": records.cpu_model(), "cores": os.cpu_count(),
                              "python": platform.python_version()},
                  "settings": {k: v for k, v in vars(args).items() if k != "json"}, "extra_train_args": extra,
                  "runs": results}
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2)
        print(f"soak: results in {args.json}")
        if tmp is not None:
            tmp.cleanup()
    for r in results:
        memory = r["verdict"].get("checks", {}).get("all processes", {})
        records.append(f"soak_{r['env'].replace(':', '_')}_{args.minutes:g}min",
                       {"verdict": {True: "FLAT", False: "NOT FLAT"}.get(r["verdict"]["flat"], "NO VERDICT"),
                        "all_processes_uss_mb": [memory.get("uss_mb_from"), memory.get("uss_mb_to")],
                        "exit_code": r["exit_code"], "processes_left": len(r["left_behind"]),
                        "new_shm_entries_after_exit": len(r["new_shm_entries_after_exit"])},
                       records.this_command())
    ok = all(r["verdict"]["flat"] and r["exit_code"] == 0 and not r["left_behind"] for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
