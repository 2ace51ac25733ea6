#!/usr/bin/python3
"""PyTorch's own distributed test suite on gloo and on gflow, side by side.

Runs `DistributedTest._DistTestBase` from Debian's python3-torch
(torch/testing/_internal/distributed/distributed_test.py) the way PyTorch's
test/distributed/test_distributed_spawn.py does: spawned ranks, file://
rendezvous, once per backend, the same selection for both. Prints (and with
--out writes) a table of every test whose outcome differs, with the failure's
first line, and the counts.

  python/tools/torch_dist_suite.py                       # gloo and gflow, 3 ranks
  python/tools/torch_dist_suite.py --backends gflow -k test_broadcast
  python/tools/torch_dist_suite.py --out suite.md --json suite.json

Three adjustments, the same for both backends (docs/python.md):
- expecttest (imported by torch's harness, not packaged in Debian 12) is
  replaced by a stand-in module;
- DDP's ReplicatedTensor mode, which torch 1.13's harness switches on and
  which fails on Debian's Python 3.11, stays off (plain DDP; torch 2.x has
  no such mode);
- gflow runs *aliased*: BACKEND stays "gloo" and init_process_group /
  new_group map "gloo" to "gflow", since some test bodies only build their
  model when BACKEND is "gloo", "nccl" or "mpi" (--native runs gflow as
  BACKEND=gflow instead). dist.get_backend stays
  "gflow": mapping it to "gloo" would make test_get_backend pass but turn
  on the tests' profiler-event checks, which expect gloo's event names.
gflow's package comes from $GFLOW_BUILD_DIR/python (default build/python).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import types
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# ---- in every process of a suite run (the runner and the spawned ranks) ----

if os.environ.get("GFLOW_SUITE_CHILD"):
    # Stand-in for expecttest: torch's common_utils reads ACCEPT and derives
    # its TestCase from expecttest.TestCase.
    _expecttest = types.ModuleType("expecttest")
    _expecttest.ACCEPT = False
    _expecttest.TestCase = unittest.TestCase
    sys.modules.setdefault("expecttest", _expecttest)

    import torch.distributed as dist  # noqa: E402

    try:  # torch 1.13 only (2.x dropped ReplicatedTensor)
        import torch.nn.parallel._replicated_tensor_ddp_utils as _rt  # noqa: E402

        _rt._set_ddp_with_replicated_tensor = lambda enabled: None  # plain DDP
    except ImportError:
        pass

    if os.environ.get("GFLOW_SUITE_ALIAS") == "gflow":
        build = os.environ.get("GFLOW_BUILD_DIR", os.path.join(REPO, "build"))
        sys.path.insert(0, os.path.join(os.path.abspath(build), "python"))
        import gflow.torch  # noqa: E402,F401  (registers the "gflow" backend)

        def _alias(backend):
            return "gflow" if str(backend).lower() == "gloo" else backend

        _init, _new_group = dist.init_process_group, dist.new_group

        def _init_process_group(backend=None, *args, **kwargs):
            return _init(_alias(backend), *args, **kwargs)

        def _new_group_aliased(*args, **kwargs):
            if "backend" in kwargs:
                kwargs["backend"] = _alias(kwargs["backend"])
            elif len(args) >= 3:
                args = args[:2] + (_alias(args[2]),) + args[3:]
            return _new_group(*args, **kwargs)

        dist.init_process_group = _init_process_group
        dist.new_group = _new_group_aliased

    from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
        DistributedTest,
        TestDistBackend,
    )

    class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            self._spawn_processes()


# ---- the runner of one backend (a child of the driver) ----

class _Recorder(unittest.TextTestResult):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.outcomes = {}

    def _name(self, test):
        return test.id().rsplit(".", 1)[-1]

    def _why(self, test, err):
        # The last "SomeError: message" line of the (innermost, a rank's)
        # traceback, else its last line (c10 errors end in backtrace frames).
        text = self._exc_info_to_string(err, test).strip().splitlines()
        lines = [line.strip() for line in text if line.strip()]
        named = [line for line in lines if re.match(r"^[\w.]+(Error|Exception): ", line)]
        return (named or lines or [""])[-1][:300]

    def addSuccess(self, test):
        super().addSuccess(test)
        self.outcomes[self._name(test)] = ("passed", "")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.outcomes[self._name(test)] = ("failed", self._why(test, err))

    def addError(self, test, err):
        super().addError(test, err)
        self.outcomes[self._name(test)] = ("failed", self._why(test, err))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.outcomes[self._name(test)] = ("skipped", str(reason)[:200])

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self.outcomes[self._name(test)] = ("passed", "expected failure")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self.outcomes[self._name(test)] = ("failed", "unexpected success")


def run_child(out_path, patterns):
    loader = unittest.TestLoader()
    names = loader.getTestCaseNames(TestDistBackendWithSpawn)
    if patterns:
        names = [n for n in names if any(p in n for p in patterns)]
    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names)
    runner = unittest.TextTestRunner(stream=sys.stderr, verbosity=2, resultclass=_Recorder)
    result = runner.run(suite)
    with open(out_path, "w") as f:
        json.dump(result.outcomes, f, indent=1, sort_keys=True)


# ---- the driver ----

def run_backend(backend, args, workdir):
    env = dict(os.environ)
    # --native: gflow under its own name (BACKEND=gflow; test bodies that
    # build a model for gloo, nccl or mpi only then skip it).
    name = "gflow" if backend == "gflow" and args.native else "gloo"
    env.update(GFLOW_SUITE_CHILD="1", BACKEND=name, WORLD_SIZE=str(args.world_size),
               INIT_METHOD="file://" + os.path.join(workdir, "init"),
               TEMP_DIR=os.path.join(workdir, "tmp"))
    env.pop("GFLOW_SUITE_ALIAS", None)
    if backend == "gflow":
        env["GFLOW_SUITE_ALIAS"] = "gflow"
    os.makedirs(env["TEMP_DIR"], exist_ok=True)
    out = os.path.join(workdir, backend + ".json")
    log = os.path.join(workdir, backend + ".log")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", out] + \
        sum((["-k", k] for k in args.k), [])
    start = time.time()
    with open(log, "w") as f:
        rc = subprocess.call(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=workdir)
    print("%s: %.0f s, exit %d, log %s" % (backend, time.time() - start, rc, log),
          file=sys.stderr)
    if not os.path.exists(out):
        sys.exit("%s: the suite wrote no results; see %s" % (backend, log))
    with open(out) as f:
        return json.load(f)


def table(results, backends):
    lines = []
    counts = ["| backend | passed | failed | skipped |", "|---|---:|---:|---:|"]
    for b in backends:
        o = [v[0] for v in results[b].values()]
        counts.append("| %s | %d | %d | %d |" % (b, o.count("passed"), o.count("failed"),
                                                 o.count("skipped")))
    lines += counts + [""]
    if len(backends) == 2:
        a, b = backends
        differ = sorted(t for t in set(results[a]) | set(results[b])
                        if results[a].get(t, ("absent",))[0] != results[b].get(t, ("absent",))[0])
        lines.append("%d tests differ:" % len(differ))
        lines.append("")
        lines.append("| test | %s | %s | why (%s) |" % (a, b, b))
        lines.append("|---|---|---|---|")
        for t in differ:
            ra, rb = results[a].get(t, ("absent", "")), results[b].get(t, ("absent", ""))
            why = rb[1].replace("|", "\\|")
            lines.append("| `%s` | %s | %s | %s |" % (t, ra[0], rb[0], why))
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", nargs="+", default=["gloo", "gflow"],
                   choices=["gloo", "gflow"])
    p.add_argument("--world-size", type=int, default=3)
    p.add_argument("-k", action="append", default=[],
                   help="run only tests whose name contains this (repeatable)")
    p.add_argument("--out", help="write the table (markdown) here")
    p.add_argument("--json", help="write every test's outcome per backend here")
    p.add_argument("--native", action="store_true",
                   help="run gflow as BACKEND=gflow, not aliased as gloo")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        run_child(args.child, args.k)
        return
    results = {}
    workdir = tempfile.mkdtemp(prefix="gflow-torch-suite-")  # kept: the logs
    for b in args.backends:
        results[b] = run_backend(b, args, workdir)
        if args.json:  # written after each backend, so a later failure keeps it
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1, sort_keys=True)
    text = table(results, args.backends)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
