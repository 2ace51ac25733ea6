"""pip packaging of gflow's Python package: the extensions come from the
project's CMake build (python/CMakeLists.txt), not from setuptools.

    /usr/bin/python3 -m venv --system-site-packages /tmp/venv
    /tmp/venv/bin/pip install --no-build-isolation ./python

configures and builds a fresh CMake tree (tests, benchmarks and tools off)
under setuptools' build directory, then packages gflow/*.py, _gflow (and
_gflow_torch where libtorch-dev is installed) and libgflow.so.0 next to them.
GFLOW_CMAKE_BUILD_DIR=build (relative to the repository root, or absolute)
reuses an existing, configured build tree instead (only the Python targets are built there). Needs cmake and a C++17
compiler, plus pybind11-dev and python3-dev (docs/python.md).
"""

import os
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        return re.search(r"project\(gflow VERSION ([0-9.]+)", f.read()).group(1)


class CMakeBuild(build_ext):
    def run(self):
        build_dir = os.environ.get("GFLOW_CMAKE_BUILD_DIR")
        if build_dir:
            build_dir = os.path.join(ROOT, build_dir)  # relative: to the repository root
        else:
            build_dir = os.path.abspath(os.path.join(self.build_temp, "cmake"))
            cmd = ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                   "-DGFLOW_BUILD_TESTS=OFF", "-DGFLOW_BUILD_BENCH=OFF", "-DGFLOW_BUILD_TOOLS=OFF",
                   "-DGFLOW_WERROR=OFF", "-DGFLOW_BUILD_PYTHON=ON",
                   "-DPython_EXECUTABLE=" + sys.executable]
            if shutil.which("ninja"):
                cmd += ["-G", "Ninja"]
            subprocess.check_call(cmd)
        jobs = str(os.cpu_count() or 1)
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "_gflow", "-j", jobs])
        pkg = os.path.join(build_dir, "python", "gflow")
        if self._torch_target(build_dir):
            subprocess.check_call(["cmake", "--build", build_dir, "--target", "_gflow_torch",
                                   "-j", jobs])
        out = os.path.join(os.path.abspath(self.build_lib), "gflow")
        os.makedirs(out, exist_ok=True)
        for name in os.listdir(pkg):
            if name.endswith(".so"):
                shutil.copy2(os.path.join(pkg, name), out)
        # The extensions find libgflow next to them ($ORIGIN in their RPATH).
        shutil.copy2(os.path.realpath(os.path.join(build_dir, "libgflow.so.0")),
                     os.path.join(out, "libgflow.so.0"))

    @staticmethod
    def _torch_target(build_dir):
        r = subprocess.run(["cmake", "--build", build_dir, "--target", "help"],
                           capture_output=True, text=True)
        return "_gflow_torch" in r.stdout


setup(
    name="gflow",
    version=version(),
    description="gflow allreduce library: Python package and PyTorch integration",
    packages=["gflow"],
    ext_modules=[Extension("gflow._gflow", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.9",
    install_requires=["numpy"],
    zip_safe=False,
)
