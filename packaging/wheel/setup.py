"""The ddprun wheel: ddprun's programs as the environment's scripts (the ELF binaries as they are,
no Python wrapper), the progress hook under PREFIX/share/ddprun/python (where ddprun looks:
bin/../share/ddprun/python), and the `ddprun` package for `python -m ddprun`.

Run by scripts/build_wheel.sh, which stages payload/bin and payload/share beside this file and
sets DDPRUN_WHEEL_VERSION and DDPRUN_WHEEL_PLAT (the tag the binaries earn: scripts/wheel_tag.sh).
"""
import os
from pathlib import Path

from setuptools import setup  # first: it provides distutils where Python no longer does
from distutils.command.build_scripts import build_scripts  # noqa: E402
from wheel.bdist_wheel import bdist_wheel  # noqa: E402

HERE = Path(__file__).resolve().parent
PAYLOAD = HERE / "payload"


def required_env(name):
    value = os.environ.get(name, "")
    if not value:
        raise SystemExit(f"setup.py: {name} is not set: build the wheel with scripts/build_wheel.sh")
    return value


class CopyPrograms(build_scripts):
    """Copies the programs byte for byte: distutils would read an ELF file as text to look for a
    '#!python' line to rewrite."""

    def copy_scripts(self):
        self.mkpath(self.build_dir)
        outfiles = []
        for script in self.scripts:
            target = os.path.join(self.build_dir, os.path.basename(script))
            self.copy_file(script, target)  # keeps the mode
            outfiles.append(target)
        return outfiles, outfiles


class PlatformWheel(bdist_wheel):
    """py3-none-PLATFORM: any Python 3 (the package is a few lines of pure Python), one platform
    (the binaries)."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        return "py3", "none", required_env("DDPRUN_WHEEL_PLAT")


def files_under(folder):
    """(install folder, [files]) pairs for every folder under payload/share, relative to PREFIX."""
    pairs = []
    for directory in sorted(p for p in (PAYLOAD / folder).rglob("*") if p.is_dir()) + [PAYLOAD / folder]:
        files = sorted(str(f.relative_to(HERE)) for f in directory.iterdir() if f.is_file())
        if files:
            pairs.append((str(directory.relative_to(PAYLOAD)), files))
    return pairs


setup(
    name="ddprun",
    version=required_env("DDPRUN_WHEEL_VERSION"),
    description="Native launcher for data-parallel training (torchrun's flags and environment)",
    long_description=(HERE / "README.md").read_text(),
    long_description_content_type="text/markdown",
    license="See the project's repository",
    python_requires=">=3.7",
    packages=["ddprun"],
    scripts=sorted(str(p.relative_to(HERE)) for p in (PAYLOAD / "bin").iterdir()),
    data_files=files_under("share"),
    cmdclass={"build_scripts": CopyPrograms, "bdist_wheel": PlatformWheel},
    zip_safe=False,
    classifiers=[
        "Programming Language :: Python :: 3",
        "Operating System :: POSIX :: Linux",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
