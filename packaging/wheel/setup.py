"""The ddprun wheel: ddprun and ddpstore installed as scripts (into the virtualenv's bin/, as the
cmake and ninja wheels do), and ddprun's Python probe as data files beside them
(<prefix>/share/ddprun/python, which ddprun finds from its own place); and the importable package
`ddprun` (ddprun.inplace, docs/inplace.md). Built by build_wheel.py, which stages the programs
next to this file and passes the version and platform tag in the environment:
  DDP_WHEEL_VERSION   the project's version (CMake's PROJECT_VERSION)
  DDP_WHEEL_PLATFORM  linux_x86_64, or manylinux_2_NN_x86_64 when the programs qualify
Uses only Debian's python3-setuptools and python3-wheel (no network)."""
import os
import shutil
from distutils.command.build_scripts import build_scripts

from setuptools import setup
from wheel.bdist_wheel import bdist_wheel


class PlatformWheel(bdist_wheel):
    """Tagged py3-none-<platform>: the programs run on any Python 3, but on one platform only."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        return ("py3", "none", os.environ["DDP_WHEEL_PLATFORM"])


class CopyPrograms(build_scripts):
    """Copies the programs as they are: distutils would read them as Python to fix a #! line."""

    def run(self):
        os.makedirs(self.build_dir, exist_ok=True)
        for script in self.scripts:
            target = os.path.join(self.build_dir, os.path.basename(script))
            shutil.copyfile(script, target)
            os.chmod(target, 0o755)


with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "README.md")) as f:
    long_description = f.read()

setup(
    name="ddprun",
    version=os.environ["DDP_WHEEL_VERSION"],
    description="A native, torchrun-compatible launcher and elastic agent (ddprun, ddpstore)",
    long_description=long_description,
    long_description_content_type="text/markdown",
    license="see the project's repository",
    python_requires=">=3",
    packages=["ddprun"],  # ddprun.inplace (docs/inplace.md)
    scripts=["programs/ddprun", "programs/ddpstore"],
    data_files=[("share/ddprun/python",
                 sorted(os.path.join("probe", name) for name in os.listdir("probe")))] +
    ([("lib", [os.path.join("plugin", name) for name in os.listdir("plugin")])]
     if os.path.isdir("plugin") else []),
    cmdclass={"bdist_wheel": PlatformWheel, "build_scripts": CopyPrograms},
    classifiers=[
        "Operating System :: POSIX :: Linux",
        "Programming Language :: C++",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
