#!/usr/bin/python3
"""Elastic trials: kill or stop a random rank of a training job, and check
that the job goes on and ends with identical parameters on every rank.

Each trial runs examples/elastic_train.cc under
`gflowrun -n 4 --elastic --max-restarts 1`, on one path (shm, tcp,
or hier, which is two pretend hosts). Then, at random, one of two faults:

- SIGKILL: a random rank kills itself at a random step (--kill-rank,
  --kill-at);
- SIGSTOP: this script stops a random rank at a random moment. Once the
  survivors report that they shrank, it kills the stopped process, so
  gflowrun starts the replacement, as a watchdog would.

A trial passes when:
- gflowrun exits 0 within its deadline (no hang);
- the survivors shrank (at least 2 of them; a healthy rank that the others
  counted out because their verdicts differed exits with "excluded", and
  is tallied);
- every rank that finished printed the same parameter digest.

Per path it prints a tally, and these times from the epoch-ms stamps the
ranks print:
- detection: fault to the survivors' first error;
- recovery: that error to the first op on the shrunk communicator;
- join: a replacement's start (its first line) to its first op as a member
  (it waits for the next step boundary, where the members call grow()).

  bench/elastic/trials.py --gflowrun build/tools/gflowrun \\
      --train build/tests/elastic_train [--trials 20] [--paths shm,tcp,hier] [--seed S]
"""
import argparse
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

TIMEOUT_S = 2  # GFLOW_TIMEOUT: a stopped rank's deadline


def now_ms():
    return int(time.time() * 1000)


def stamps(log, word):
    """(label, epoch ms) of every line `[label] word <ms> ...`."""
    return [(m.group(1), int(m.group(2)))
            for m in re.finditer(r"^\[(\d+)\] %s (\d+)" % word, log, re.M)]


def wait_for(path, pattern, count, until):
    """Waits until `pattern` matches `count` lines of the file; its text or None."""
    while time.time() < until:
        with open(path, errors="replace") as f:
            text = f.read()
        if len(re.findall(pattern, text, re.M)) >= count:
            return text
        time.sleep(0.01)
    return None


def start(args, path, train_args, log_path):
    env = ["--env", "GFLOW_TIMEOUT=%ds" % TIMEOUT_S]
    if path == "tcp":
        env += ["--env", "GFLOW_SHM=0"]
    extra = ["--hosts", "2"] if path == "hier" else []
    cmd = [args.gflowrun, "-n", "4", "--elastic", "--max-restarts", "1", "--timeout", "60"] + \
        env + ["--", args.train, "--steps", "150", "--step-ms", "5", "--count", "65536"] + \
        train_args + extra
    log = open(log_path, "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log


def stop_trial(args, path, rng, log_path):
    """SIGSTOP a random rank; SIGKILL it once the survivors shrank."""
    proc, log = start(args, path, [], log_path)
    text = wait_for(log_path, r"^\[\d+\] ready ", 4, time.time() + 20)
    victim, fault_ms = None, None
    if text:
        time.sleep(rng.uniform(0.05, 0.5))
        pids = {lab: int(pid) for lab, pid in re.findall(r"^\[(\d+)\] ready \d+ pid (\d+)", text, re.M)}
        victim = rng.choice(sorted(pids))
        fault_ms = now_ms()
        os.kill(pids[victim], signal.SIGSTOP)
        wait_for(log_path, r"^\[\d+\] shrunk ", 3, time.time() + TIMEOUT_S + 10)
        os.kill(pids[victim], signal.SIGKILL)
    return proc, log, victim, fault_ms


def kill_trial(args, path, rng, log_path):
    victim = rng.randrange(4)
    proc, log = start(args, path, ["--kill-rank", str(victim), "--kill-at",
                                   str(rng.randrange(3, 100))], log_path)
    return proc, log, str(victim), None


def judge(log, rc, fault_ms):
    """(passed, why, detection ms, recovery ms, join ms) of one trial."""
    digests = re.findall(r"^\[\d+\] digest ([0-9a-f]+)", log, re.M)
    failed = stamps(log, "failed")
    shrunk = stamps(log, "shrunk")
    if fault_ms is None:
        killing = stamps(log, "killing")
        fault_ms = killing[0][1] if killing else None
    excluded = len(re.findall(r"^\[\d+\] excluded", log, re.M))
    why = []
    if rc != 0:
        why.append("gflowrun exited %s" % rc)
    if len(shrunk) + excluded < 3 or len(shrunk) < 2:
        why.append("%d ranks shrank, %d excluded" % (len(shrunk), excluded))
    if len(digests) < 2 or len(set(digests)) != 1:
        why.append("digests %s" % digests)
    detect = min(t for _, t in failed) - fault_ms if failed and fault_ms else None
    recover = None
    if failed and shrunk:
        first_error = {lab: t for lab, t in reversed(failed)}
        recover = max(t - first_error.get(lab, t) for lab, t in shrunk)
    joined = stamps(log, "joined")
    started = dict(stamps(log, "start"))
    join = None
    if joined:
        lab, t = joined[0]
        join = t - started[lab] if lab in started else None
    return not why, "; ".join(why), detect, recover, join, excluded


def summary(values):
    v = [x for x in values if x is not None]
    if not v:
        return "-"
    return "%d / %d / %d" % (min(v), statistics.median(v), max(v))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gflowrun", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--paths", default="shm,tcp,hier")
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    print("seed %d" % seed)
    rows, ok = [], True
    with tempfile.TemporaryDirectory() as tmp:
        for path in args.paths.split(","):
            res = {"pass": 0, "kill": 0, "stop": 0, "excluded": 0, "detect_kill": [],
                   "detect_stop": [], "recover": [], "join": []}
            for trial in range(args.trials):
                stop = rng.random() < 0.5
                log_path = os.path.join(tmp, "%s-%d.log" % (path, trial))
                proc, log, victim, fault_ms = (stop_trial if stop else kill_trial)(
                    args, path, rng, log_path)
                try:
                    rc = proc.wait(timeout=90)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    rc = "hung"
                log.close()
                with open(log_path, errors="replace") as f:
                    text = f.read()
                passed, why, detect, recover, join, excluded = judge(text, rc, fault_ms)
                res["excluded"] += excluded
                res["stop" if stop else "kill"] += 1
                res["pass"] += passed
                for k, v in (("detect_stop" if stop else "detect_kill", detect),
                             ("recover", recover), ("join", join)):
                    res[k].append(v)
                print("%s trial %2d: %s rank %s: %s%s" % (
                    path, trial, "SIGSTOP" if stop else "SIGKILL", victim,
                    "ok" if passed else "FAIL", "" if passed else " (%s)\n%s" % (why, text)))
                sys.stdout.flush()
                ok = ok and passed
            rows.append((path, res))
    print("\n| path | trials | passed | SIGKILL / SIGSTOP | healthy ranks counted out "
          "| detection ms, SIGKILL | detection ms, SIGSTOP | recovery ms | join ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for path, r in rows:
        print("| %s | %d | %d | %d / %d | %d | %s | %s | %s | %s |" % (
            path, r["kill"] + r["stop"], r["pass"], r["kill"], r["stop"], r["excluded"],
            summary(r["detect_kill"]), summary(r["detect_stop"]), summary(r["recover"]),
            summary(r["join"])))
    print("(min / median / max; a SIGSTOP's detection includes the %d s deadline)" % TIMEOUT_S)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
