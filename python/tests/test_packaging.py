"""pip install of python/ (docs/python.md): the installed package is self-
contained (extensions + libgflow.so.0 found through $ORIGIN) and works
outside the build tree. Reuses this build (GFLOW_CMAKE_BUILD_DIR), so it
only packages; a from-scratch pip build configures its own CMake tree."""

import os
import subprocess
import sys

from conftest import BUILD, REPO


def test_pip_install_target(tmp_path):
    target = tmp_path / "site"
    env = dict(os.environ, GFLOW_CMAKE_BUILD_DIR=BUILD)
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                        "--no-index", "--target", str(target), os.path.join(REPO, "python")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    names = sorted(os.listdir(target / "gflow"))
    assert "libgflow.so.0" in names and any(n.startswith("_gflow.") for n in names), names
    code = """
import socket, numpy as np, gflow
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
comm = gflow.create(rank=0, size=1, root="127.0.0.1:%d" % port)
x = np.arange(4, dtype=np.float32); comm.allreduce(x, "sum")
assert x.tolist() == [0, 1, 2, 3]
libs = {l.split()[-1] for l in open("/proc/self/maps") if "libgflow.so" in l}
print(gflow.__file__, *sorted(libs))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GFLOW_")}
    env["PYTHONPATH"] = str(target)
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    module, *libs = r.stdout.split()
    assert module.startswith(str(target)), module
    assert libs == [str(target / "gflow" / "libgflow.so.0")], libs
