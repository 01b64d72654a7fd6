"""ddprun's programs, installed by this wheel into the environment's scripts folder.

    python -m ddprun ARGS...   runs the ddprun program with ARGS (what `ddprun ARGS...` does).
"""
import os
import sys
import sysconfig
from pathlib import Path

__all__ = ["find_program"]


def _scripts_folders():
    """Where pip puts a wheel's scripts: the scheme of this interpreter (a virtual or conda
    environment, the system), the user scheme (pip install --user), and the bin/ beside the
    site-packages this package is in (pip install --prefix or --target)."""
    folders = [sysconfig.get_path("scripts")]
    user_scheme = f"{os.name}_user"
    if user_scheme in sysconfig.get_scheme_names():
        folders.append(sysconfig.get_path("scripts", user_scheme))
    here = Path(__file__).resolve().parent
    folders += [str(here.parents[3] / "bin"), str(here.parent / "bin")]  # PREFIX/lib/pythonX.Y/site-packages/ddprun; TARGET/ddprun
    # The copy ddprun's workers import (PREFIX/share/ddprun/python/ddprun: PREFIX/bin above), and
    # in a build tree (BUILD/share/ddprun/python/ddprun) the programs where the build makes them.
    build = here.parents[3]
    folders += [str(build / "launcher"), str(build / "rendezvous"), str(build / "agent")]
    return folders


def find_program(name="ddprun"):
    """The path of one of the wheel's programs (ddprun, ddprun-full, ddprun-stack, ddprun-store)."""
    for folder in _scripts_folders():
        path = os.path.join(folder, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise FileNotFoundError(
        f"{name} was not found where pip installs this package's programs "
        f"({', '.join(_scripts_folders())}); reinstall the wheel: pip install --force-reinstall ddprun-*.whl")


def main(argv=None):
    """Replaces this process with the ddprun program, given the same arguments."""
    path = find_program("ddprun")
    args = sys.argv[1:] if argv is None else list(argv)
    os.execv(path, [path, *args])
