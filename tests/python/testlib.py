"""What the Python tests share: skip() as tests/lib.sh's (exit 77, which ctest shows as skipped;
under CI=true a failure, since CI installs every tool a test needs). A test skips whole or not
at all."""
import os
import sys


def skip(why):
    if os.environ.get("CI") in ("true", "1"):
        print(f"FAILED: CI=true and this test cannot run: {why}")
        sys.exit(1)
    print(f"SKIP: {why}")
    sys.exit(77)


def need_torch():
    """Skips (as skip()) unless this interpreter can import torch."""
    try:
        import torch  # noqa: F401
    except ImportError as e:
        skip(f"torch is not importable with {sys.executable}: {e}")
