"""Build steps that pyproject.toml cannot state: the version from the project's CMakeLists.txt,
and libstrata.so bundled into the package, so that an installed `strata` needs neither the source
checkout nor STRATA_LIBRARY.

The library is taken from $STRATA_LIBRARY when set, else from the checkout's build tree
(build/runtime/libstrata.so, what `bash cmake/bootstrap.sh` builds). Without either the build
stops with a message that says how to get one.
"""
import os
import re
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


def project_version():
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        match = re.search(r"project\(strata VERSION ([0-9.]+)", f.read())
    if not match:
        raise SystemExit("strata: no 'project(strata VERSION ...)' in " + ROOT + "/CMakeLists.txt")
    return match.group(1)


def library_to_bundle():
    env = os.environ.get("STRATA_LIBRARY")
    if env:
        if not os.path.isfile(env):
            raise SystemExit(f"strata: STRATA_LIBRARY={env} is not a file")
        return env
    built = os.path.join(ROOT, "build", "runtime", "libstrata.so")
    if os.path.isfile(built):
        return built
    raise SystemExit(
        "strata: libstrata.so not found at " + built + "; build it first (bash cmake/bootstrap.sh, "
        "or cmake --build build --target strata) or set STRATA_LIBRARY to the one to bundle")


class BuildWithLibrary(build_py):
    """Copies libstrata.so (the file, not the symlink chain) into the built package."""

    def run(self):
        super().run()
        source = library_to_bundle()
        target = os.path.join(self.build_lib, "strata", "libstrata.so")
        self.announce(f"bundling {source} as {target}", level=2)
        shutil.copyfile(os.path.realpath(source), target)


class BinaryDistribution(Distribution):
    """The package carries a native library: its wheel is tagged for this platform."""

    def has_ext_modules(self):
        return True


setup(version=project_version(), cmdclass={"build_py": BuildWithLibrary},
      distclass=BinaryDistribution)
