"""Builds the chorus_torch package with CMake (the whole of Chorus, then the extension) against the
torch of the Python that runs pip, and packages the extension with libchorus beside it.

    pip install --no-build-isolation ./frameworks/torch

--no-build-isolation: the build must see the venv's torch, not a fresh copy pip would fetch.
CHORUS_BUILD_DIR names a CMake build folder to build in (and reuse); by default
<repo>/build/pip-<python tag>. CHORUS_CMAKE_ARGS adds CMake options (space-separated).
"""
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


class BuildWithCMake(build_py):
    def run(self):
        super().run()  # the package's sources; the build's configured __init__.py replaces them below
        tag = sysconfig.get_config_var("SOABI") or "py"
        build = os.path.abspath(os.environ.get("CHORUS_BUILD_DIR") or os.path.join(ROOT, "build", "pip-" + tag))
        args = ["-DCMAKE_BUILD_TYPE=Release", "-DCHORUS_TORCH_PYTHON=" + sys.executable, "-DCHORUS_BUILD_TORCH=ON"]
        if not os.environ.get("CHORUS_BUILD_DIR"):
            args += ["-DCHORUS_BUILD_TESTS=OFF", "-DCHORUS_BUILD_BENCH=OFF", "-DCHORUS_BUILD_UNTESTED=OFF"]
        args += shlex.split(os.environ.get("CHORUS_CMAKE_ARGS", ""))
        generator = ["-G", "Ninja"] if shutil.which("ninja") and not os.path.exists(
            os.path.join(build, "CMakeCache.txt")) else []
        cache = os.path.join(build, "CMakeCache.txt")
        prefix = "CHORUS_TORCH_PYTHON:FILEPATH="
        configured = os.path.exists(cache) and any(
            line.startswith(prefix) and os.path.samefile(line[len(prefix):].strip() or "/", sys.executable)
            and os.path.dirname(line[len(prefix):].strip()) == os.path.dirname(sys.executable)
            for line in open(cache))
        if not configured or os.environ.get("CHORUS_CMAKE_ARGS"):
            subprocess.check_call(["cmake", "-S", ROOT, "-B", build] + generator + args)
        subprocess.check_call(["cmake", "--build", build, "--target", "chorus_torch", "-j", str(os.cpu_count() or 2)])
        src = os.path.join(build, "python", "chorus_torch")
        dst = os.path.join(self.build_lib, "chorus_torch")
        os.makedirs(dst, exist_ok=True)
        for name in os.listdir(src):
            if name.endswith((".so", ".py")) or ".so." in name:
                shutil.copy2(os.path.join(src, name), os.path.join(dst, name))


class BinaryDistribution(Distribution):
    def has_ext_modules(self):  # the wheel holds compiled code for this Python and platform
        return True


setup(packages=["chorus_torch"], cmdclass={"build_py": BuildWithCMake}, distclass=BinaryDistribution)
