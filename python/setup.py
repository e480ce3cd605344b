"""Builds the package with the C API's shared library inside it.

The library comes from, in this order: the file named by $RINA_API_LIB,
the repository's target/release or target/debug (whichever is newer), or
`cargo build --release -p rina-api` run in the repository. The package is
then self-contained: `pip install ./python` needs no other step.
"""

import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
LIB = "librina_api.so"


def find_library():
    env = os.environ.get("RINA_API_LIB")
    if env:
        if not os.path.isfile(env):
            raise SystemExit(f"RINA_API_LIB={env} is not a file")
        return env
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target"))
    built = [
        os.path.join(target, profile, LIB)
        for profile in ("release", "debug")
        if os.path.isfile(os.path.join(target, profile, LIB))
    ]
    if built:
        return max(built, key=os.path.getmtime)
    if not os.path.isfile(os.path.join(REPO, "Cargo.toml")):
        raise SystemExit(
            "librina_api.so not found: set RINA_API_LIB, or install from the repository"
        )
    subprocess.check_call(["cargo", "build", "--release", "-p", "rina-api"], cwd=REPO)
    return os.path.join(target, "release", LIB)


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        dest = os.path.join(self.build_lib, "rina")
        os.makedirs(dest, exist_ok=True)
        shutil.copy2(find_library(), os.path.join(dest, LIB))


class BinaryDistribution(Distribution):
    """The wheel holds a native library: it is platform-specific."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithLibrary}, distclass=BinaryDistribution)
