"""The real-Slurm tests (marker ``slurm``): they need the local cluster of tools/slurm-local/up.sh.

Without it they skip, each saying why and how to get one (`make slurm-up`: root and apt-get);
``--require-slurm`` (what .ci/run passes) turns that skip into a failure, so CI cannot pass
having run none of them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

MARK = "# written by canzona tools/slurm-local/up.sh"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--require-slurm", action="store_true", help="fail (not skip) the slurm tests when no local Slurm is up"
    )


def _why_not_up() -> str | None:
    conf = Path("/etc/slurm/slurm.conf")
    if shutil.which("sbatch") is None or not conf.is_file() or MARK not in conf.read_text().splitlines()[0]:
        how = "run `make slurm-up` (tools/slurm-local/up.sh: needs root and apt-get)"
        if os.geteuid() != 0:
            how += "; this user is not root"
        elif shutil.which("apt-get") is None:
            how += "; this machine has no apt-get"
        return f"no local Slurm cluster of tools/slurm-local/up.sh here: {how}"
    try:
        idle = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"the local Slurm does not answer ({exc}); restart it: make slurm-down slurm-up"
    if idle.returncode != 0 or "n1" not in idle.stdout or "n2" not in idle.stdout:
        return f"the local Slurm has not nodes n1, n2 up: {idle.stdout.strip() or idle.stderr.strip()}"
    return None


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> dict[str, bool]:
    """The local cluster's facts: {"accounting": slurmdbd is configured}."""
    why = _why_not_up()
    if why is not None:
        if request.config.getoption("--require-slurm", default=False):
            pytest.fail(why)
        pytest.skip(why)
    conf = Path("/etc/slurm/slurm.conf").read_text()
    return {"accounting": "accounting_storage/slurmdbd" in conf}
