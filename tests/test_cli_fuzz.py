"""No traceback for user error, anywhere in the CLI: a table of bad inputs for every command, plus
random junk in numeric flags. Each must exit 2 with ONE line on stderr (argparse's usage included)
and start no work. The count is printed (``pytest -s`` shows it) and must stay >= 100."""

from __future__ import annotations

import copy
import json
import math
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomllib
from hypothesis import given, settings
from hypothesis import strategies as st

from canzona.argtypes import OutputPath
from canzona.commands.cli import main
from tests.cli_helpers import command_parsers as _command_parsers
from tests.hypothesis_profiles import examples

BAD_NUMBERS = ("0", "-1", "1e400", "nan", "inf", "abc", "1.5e", "")
BAD_FRACTIONS = ("-0.1", "1.5", "nan", "1e400", "x")


def _files(tmp: Path) -> dict[str, str]:
    folder = tmp / "folder"
    folder.mkdir()
    binary = tmp / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00 not utf-8")
    plain = tmp / "plain.txt"
    plain.write_text("a file, not a folder\n")
    badjson = tmp / "bad.json"
    badjson.write_text('{"model_type": "gpt2", "hidden_size": 8}')
    qwen = {
        "model_type": "qwen3",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "vocab_size": 256,
    }
    moe = {**qwen, "model_type": "qwen3_moe", "num_experts": 4, "moe_intermediate_size": 32}
    llama8b = {
        "model_type": "llama",
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "vocab_size": 128256,
    }
    configs = {
        "head_dim0": {**qwen, "head_dim": 0},
        "bias_string": {**qwen, "model_type": "llama", "attention_bias": "false"},
        "dense_outside": {**moe, "mlp_only_layers": [5]},
        "layers_huge": {**qwen, "num_hidden_layers": 10**7},
        "experts_huge": {**moe, "num_experts": 10**7},
        "llama8b": llama8b,
        "vocab_odd": {**qwen, "vocab_size": 1001},  # TP2 does not divide it: padded to 1024, as Megatron pads
    }
    out = {}
    for name, doc in configs.items():
        (tmp / f"{name}.json").write_text(json.dumps(doc))
        out[name] = str(tmp / f"{name}.json")
    for name, text in (("alpha", 'alpha = "0.5"'), ("lr", 'lr = "1e-3"'), ("model3", "model = 3")):
        head = "" if name == "model3" else 'model = "qwen3-micro"\n'
        (tmp / f"{name}.toml").write_text(head + text + "\n")
        out[f"run_{name}"] = str(tmp / f"{name}.toml")
    return out | {
        "long": str(tmp / ("n" * 300)),
        "missing": str(tmp / "missing.toml"),
        "folder": str(folder),
        "binary": str(binary),
        "file": str(plain),
        "under_file": str(plain / "out"),
        "badjson": str(badjson),
    }


def cases(f: dict[str, str]) -> list[list[str]]:
    m = ["--model", "qwen3-micro"]
    out: list[list[str]] = []
    # canzona plan
    for flag in ("--tp", "--pp", "--dp", "--ep", "--world", "--bucket-size", "--capacity-bytes"):
        out += [["plan", *m, "--dp", "2", flag, v] for v in BAD_NUMBERS]
    out += [["plan", *m, "--dp", "2", "--alpha", v] for v in BAD_FRACTIONS]
    out += [
        ["plan", *m, "--dp", "1000000000"],
        ["plan", *m, "--world", "1000000000000"],
        ["plan", *m, "--dp", "2", "--save", f["folder"]],
        ["plan", *m, "--dp", "2", "--save", f["under_file"]],
        ["plan", *m, "--dp", "2", "--plot", f["folder"]],
        ["plan", *m, "--dp", "2", "--cost", "measured", "--cost-table", f["missing"]],
        ["plan", *m, "--dp", "2", "--cost", "measured", "--cost-table", f["folder"]],
        ["plan", *m, "--dp", "2", "--cost", "measured", "--cost-table", f["file"]],
        ["plan", *m, "--dp", "2", "--strategy", "fast"],
        ["plan", *m, "--dp", "2", "--dp-layout", "sideways"],
        ["plan", *m, "--dp", "2", "--view", "heads"],
        ["plan", *m, "--dp", "2", "--tp", "4"],
        ["plan", *m, "--dp", "2", "--ep", "2"],
        ["plan", "--model", f["missing"], "--dp", "2"],
        ["plan", "--model", f["binary"], "--dp", "2"],
        ["plan", "--model", f["badjson"], "--dp", "2"],
        ["plan", "--model", f["folder"], "--dp", "2"],
        ["plan", "--model", "qwen3-30b-a3b", "--dp", "2", "--tp", "8"],
        ["plan", *m, "--dp", "3", "--world", "8"],
        ["plan", *m, "--no-such-flag"],
    ]
    # round two (issue 30): silently accepted model files, unbounded sizes, late path checks
    for name in ("head_dim0", "bias_string", "dense_outside", "layers_huge", "experts_huge"):
        out += [["models", f[name]], ["plan", "--model", f[name], "--dp", "2"]]
    out += [
        ["plan", *m, "--dp", "2", "--save", f["long"] + "/x.json"],
        ["plan", *m, "--dp", "2", "--plot", f["long"] + ".png"],
        ["train", "--model", f["llama8b"], "--device", "cpu"],
        ["train", *m, "--dp", "1000000000", "--global-batch", "1000000000"],
        ["train", *m, "--results", "/proc/canzona-nope.jsonl"],
        ["train", "--config", f["run_alpha"]],
        ["train", "--config", f["run_lr"]],
        ["train", "--config", f["run_model3"]],
        ["bench-step", "--strategies", ""],
        ["project", "--preset", "paper", "--layout", "x"],
        ["plan", *m, "--dp", "2", "--ep", "2"],
    ]
    # canzona models
    out += [
        ["models", "nope"],
        ["models", f["binary"]],
        ["models", "qwen3-micro", "--tp", "0"],
        ["models", "qwen3-micro", "--stage", "-1"],
        ["models", "qwen3-micro", "--pp", "2", "--stage", "5"],
        ["models", "qwen3-micro", "--view", "x"],
    ]
    # canzona plan-bench
    out += [["plan-bench", "--bucket-size", v] for v in ("0", "1e400")]
    out += [["plan-bench", "--out", f["file"]], ["plan-bench", "--models", "qwen9"]]
    # canzona bench-step (forks nothing when its input is bad)
    for flag in ("--nproc", "--steps", "--dp", "--tp", "--bucket-size"):
        out += [["bench-step", flag, v] for v in ("0", "-1", "1e400", "x")]
    out += [["bench-step", "--warmup", "-1"], ["bench-step", "--alpha", "2"], ["bench-step", "--out", f["folder"]]]
    # canzona bench-ns
    out += [["bench-ns", "--shapes", "64x64", flag, "0"] for flag in ("--steps", "--repeats", "--tp", "--threads")]
    out += [["bench-ns", "--shapes", "64x64", "--out", f["folder"]]]
    # canzona train (validated before anything is launched)
    t = ["train", *m]
    for flag in ("--tp", "--pp", "--dp", "--seq-len", "--micro-batch", "--global-batch", "--iters", "--nproc"):
        out += [[*t, flag, v] for v in ("0", "1e400")]
    out += [[*t, "--alpha", v] for v in ("1.5", "nan")]
    out += [[*t, "--lr", "-1"], [*t, "--weight-decay", "-0.5"], [*t, "--warmup", "-1"], [*t, "--seed", "-3"]]
    out += [[*t, "--results", f["folder"]], [*t, "--method", "fsdp"], ["train", "--config", f["missing"]]]
    out += [["train", "--config", f["binary"]], ["train", "--model", "gpt-2", "--dp", "1"]]
    # canzona sweep
    for action in ("show", "run", "status", "collect"):
        out += [["sweep", action, f["missing"]], ["sweep", action, f["folder"]], ["sweep", action, f["binary"]]]
    out += [
        ["sweep", "run", f["badjson"]],
        ["sweep", "run", "slurm/sweeps/table2.toml", "--max-world", "0"],
        ["sweep", "run", "slurm/sweeps/table2.toml", "--timeout-s", "nan"],
        ["sweep", "run", "slurm/sweeps/table2.toml", "--runs-dir", f["file"]],
        ["sweep", "run", "slurm/sweeps/table2.toml", "--backend", "slurm", "--profile", f["missing"]],
        ["sweep", "status", "slurm/sweeps/table2.toml", "--tail", "-1"],
    ]
    # canzona table2 / project / calibrate-cpu
    out += [
        ["table2", "--results", f["missing"]],
        ["table2", "--results", f["binary"], "--out", str(Path(f["folder"]) / "t2")],
        ["table2", "--results", f["folder"], "--out", f["file"]],
        ["table2", "--results", f["folder"], "--validation", f["missing"]],
        ["project", "--seq-len", "0"],
        ["project", "--alpha", "7"],
        ["project", "--layout", "32,8"],
        ["project", "--validate", f["missing"]],
        ["calibrate-cpu", "--nproc", "0"],
        ["calibrate-cpu", "--reps", "0"],
        ["calibrate-cpu", "--out", f["folder"]],
    ]
    return out


def test_every_bad_input_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = cases(_files(tmp_path))
    failures = []
    for argv in bad:
        try:
            rc = main(argv)
        except Exception as exc:  # noqa: BLE001 - a traceback: record it and go on, to report every one
            failures.append((argv, f"raised {type(exc).__name__}: {exc}"))
            continue
        _, err = capsys.readouterr()
        lines = err.strip().splitlines()
        if rc != 2 or len(lines) != 1 or "Traceback" in err:
            failures.append((argv, f"rc={rc} stderr={err!r}"))
    with capsys.disabled():
        print(f"\nCLI fuzz: {len(bad)} bad inputs, {len(failures)} without a one-line exit 2")
    assert len(bad) >= 100
    assert not failures, "\n".join(f"{' '.join(a)} -> {why}" for a, why in failures)


@settings(max_examples=examples(60), deadline=None)
@given(
    st.sampled_from(["--alpha", "--bucket-size", "--tp", "--dp", "--capacity-bytes"]),
    st.text(alphabet="0123456789.-+eEinfatx ", max_size=8),
)
def test_junk_in_numeric_flags_never_raises(flag: str, junk: str) -> None:
    argv = ["plan", "--model", "qwen3-micro", "--dp", "2", flag, junk, "--json"]
    if flag == "--dp":
        argv = ["plan", "--model", "qwen3-micro", "--dp", junk, "--json"]
    assert main(argv) in (0, 2)  # a valid value plans; anything else is one line and exit 2


# --------------------------------------------------------------------------- generated variants
# The cases below are GENERATED from what the CLI and its input files declare, so a new flag or a new
# file field is fuzzed without a new hand-written case: every field of every kind of input file gets
# values of the wrong type, every output flag gets paths that cannot be written, every integer flag a
# huge value, and a few commands run under odd locales and matplotlib backends. Each case must end in
# exit 0 or in exit 2 with one line, without a traceback, within CASE_LIMIT_S, and leave every file
# around it (the sandbox it runs in, which holds the default output folders) as it was.

REPO = Path(__file__).resolve().parents[1]
CASE_LIMIT_S = 10
# commands that do real work (fork ranks, write results) when their input is valid: a huge size must
# be refused by them, never run
WORKING = ("train", "bench-step", "bench-ns", "calibrate-cpu", "plan-bench", "sweep run", "gpu-check")


def _wrong_values(v: object, n: int) -> list[object]:
    """Values of other TOML/JSON types than ``v`` (and, for numbers, out-of-range ones). Field ``n``
    gets two of the other types, rotating, so every type is tried across the fields of a file while
    the suite stays short."""
    pool: list[object] = ["text", 7, 0.5, True, [], {"x": 1}]
    other = [w for w in pool if type(w) is not type(v)]
    out = [other[n % len(other)], other[(n + 3) % len(other)]]
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        out += [-1, 0, 10**15]
    if isinstance(v, str):
        out += ["x" * 300]
    if isinstance(v, list) and v:
        out += [[*v, {"x": 1}]]
    return out


def _leaves(doc: object, path: tuple = ()) -> list[tuple[tuple, object]]:
    """(path, value) of every field; into tables and the first table of each array of tables."""
    if isinstance(doc, dict):
        return [leaf for k, v in doc.items() for leaf in _leaves(v, (*path, k))] if doc or not path else [(path, doc)]
    if isinstance(doc, list) and doc and isinstance(doc[0], dict):
        return _leaves(doc[0], (*path, 0))
    return [(path, doc)]


def _with(doc: object, path: tuple, value: object) -> object:
    doc = copy.deepcopy(doc)
    node = doc
    for k in path[:-1]:
        node = node[k]  # type: ignore[index]
    node[path[-1]] = value  # type: ignore[index]
    return doc


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v) if not isinstance(v, float) or math.isfinite(v) else ("nan" if v != v else "inf")
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    assert isinstance(v, dict)
    return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"


def _toml(doc: dict) -> str:
    """A TOML text of ``doc``: scalars first, then tables, then arrays of tables (nesting inline)."""
    tables = {k: v for k, v in doc.items() if isinstance(v, dict) and v}
    arrays = {k: v for k, v in doc.items() if isinstance(v, list) and v and all(isinstance(x, dict) for x in v)}
    lines = [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in doc.items() if k not in tables and k not in arrays]
    for k, v in tables.items():
        lines += [f"[{json.dumps(k)}]", *(f"{json.dumps(a)} = {_toml_value(b)}" for a, b in v.items())]
    for k, rows in arrays.items():
        for row in rows:
            lines += [f"[[{json.dumps(k)}]]", *(f"{json.dumps(a)} = {_toml_value(b)}" for a, b in row.items())]
    return "\n".join(lines) + "\n"


# kind -> (a valid example file shipped with the project, the command that reads it; {} is the file)
FILE_KINDS: dict[str, tuple[str, list[str]]] = {
    "HuggingFace config.json": ("canzona/models/configs/qwen3-30b-a3b.json", ["models", "{}"]),
    "Llama config.json": ("canzona/models/configs/llama-3-8b.json", ["models", "{}"]),
    "model inventory": ("canzona/models/configs/qwen3-tiny-widefc1.toml", ["models", "{}"]),
    # --nproc that matches no layout: whatever the config says, nothing is launched
    "run config": ("canzona/harness/configs/tiny-dp4.toml", ["train", "--config", "{}", "--nproc", "999"]),
    "sweep definition": ("slurm/sweeps/local.toml", ["sweep", "show", "{}"]),
    "cluster profile": (
        "slurm/profiles/local-cpu.toml",
        ["sweep", "show", str(REPO / "slurm/sweeps/local.toml"), "--profile", "{}"],
    ),
    "hardware profile": (
        "canzona/hardware/profiles/cpu-local.toml",
        ["project", "--profile", "{}", "--model", "qwen3-micro", "--layout", "2,1,1", "--methods", "canzona"],
    ),
}


def typed_value_cases(tmp: Path) -> list[tuple[str, list[str]]]:
    out = []
    for kind, (example, argv) in FILE_KINDS.items():
        src = REPO / example
        doc = json.loads(src.read_text()) if src.suffix == ".json" else tomllib.loads(src.read_text())
        for n, (path, value) in enumerate(_leaves(doc)):
            for m, wrong in enumerate(_wrong_values(value, n)):
                f = tmp / f"{src.stem}-{n}-{m}{src.suffix}"
                bad = _with(doc, path, wrong)
                f.write_text(json.dumps(bad) if src.suffix == ".json" else _toml(bad))  # type: ignore[arg-type]
                out.append(
                    (f"{kind} {'.'.join(map(str, path))} = {wrong!r:.40}", [a.replace("{}", str(f)) for a in argv])
                )
    return out


def _base(words: list[str]) -> list[str]:
    """Arguments that make ``words`` a complete command (the fuzzed flag comes after them)."""
    if words[0] == "sweep":
        return [*words, str(REPO / "slurm/sweeps/local.toml")]
    return {
        "plan": ["plan", "--model", "qwen3-micro", "--dp", "2"],
        "models": ["models", "qwen3-micro"],
        "train": ["train", "--model", "qwen3-micro", "--device", "cpu"],
        "bench-ns": ["bench-ns", "--shapes", "64x64"],
        "table2": ["table2", "--results", str(REPO / "results/table2-local.jsonl")],
    }.get(words[0], list(words))


def output_path_cases(tmp: Path) -> list[tuple[str, list[str]]]:
    plain = tmp / "a-file.txt"
    plain.write_text("a file, not a folder\n")
    (tmp / "a-folder").mkdir()
    bad_for_any = {
        "under /proc": "/proc/canzona-nope/out.jsonl",
        "name over the limit": str(tmp / ("n" * 300) / "out.jsonl"),
        "under a file": str(plain / "out.jsonl"),
        "empty": "",
    }
    out = []
    for words, p in _command_parsers():
        for a in p._actions:
            kind = getattr(a.type, "__name__", "")
            if not isinstance(a.type, OutputPath) or not a.option_strings:
                continue
            bad = dict(bad_for_any)
            bad["a folder" if kind == "output_file" else "a file"] = (
                str(tmp / "a-folder") if kind == "output_file" else str(plain)
            )
            for why, path in bad.items():
                out.append(
                    (f"{' '.join(words)} {a.option_strings[0]} {why}", [*_base(words), a.option_strings[0], path])
                )
    return out


def huge_size_cases() -> list[tuple[str, list[str], bool]]:
    """(label, argv, must_refuse): every integer flag of every command at 10^15 and 10^30."""
    out = []
    for words, p in _command_parsers():
        for a in p._actions:
            if (getattr(a.type, "__name__", "") != "integer" and a.type is not int) or not a.option_strings:
                continue
            if "seed" in a.dest:  # a seed is a label, not a size
                continue
            for v in ("1e15", "1" + "0" * 30):
                cmd = " ".join(words)
                out.append(
                    (f"{cmd} {a.option_strings[0]} {v}", [*_base(words), a.option_strings[0], v], cmd in WORKING)
                )
    return out


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Size and mtime of every regular file under ``root`` (symlinks to files followed, symlinked
    folders not entered, as ``Path.rglob`` + ``is_file``), one ``stat`` per file: it runs after
    every case, over a sandbox that holds the hundreds of generated input files."""
    out = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            try:
                st = os.stat(path)
            except FileNotFoundError:  # a dangling link: not a file
                continue
            if stat.S_ISREG(st.st_mode):
                out[path] = (st.st_size, st.st_mtime_ns)
    return out


class _TooLong(Exception):
    pass


def _run_case(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int | None, str, float]:
    """(exit code or None for a traceback, stderr, seconds); SIGALRM ends a case past the limit."""

    def stop(*_: object) -> None:
        raise _TooLong

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(CASE_LIMIT_S + 5)
    t0 = time.perf_counter()
    try:
        rc: int | None = main(argv)
    except _TooLong:
        rc = None
        print(f"still running after {CASE_LIMIT_S + 5} s", file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 - a traceback: reported with the others
        rc = None
        print(f"raised {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    _, err = capsys.readouterr()
    return rc, err, time.perf_counter() - t0


def _check_cases(
    cases: list[tuple[str, list[str], bool]], sandbox: Path, capsys: pytest.CaptureFixture[str], what: str
) -> None:
    before = _snapshot(sandbox)
    failures, slow = [], []
    for label, argv, must_refuse in cases:
        rc, err, seconds = _run_case(argv, capsys)
        lines = err.strip().splitlines()
        if seconds > CASE_LIMIT_S:
            slow.append(f"{label}: {seconds:.1f} s")
        if rc not in ((2,) if must_refuse else (0, 2)) or (rc == 2 and len(lines) != 1) or "Traceback" in err:
            failures.append(f"{label} -> rc={rc} stderr={err.strip()[:300]!r}")
        if rc == 2:
            after = _snapshot(sandbox)
            if after != before:
                changed = sorted(set(after.items()) ^ set(before.items()))
                failures.append(f"{label} -> refused, yet changed {changed[:3]}")
            before = after
        else:
            before = _snapshot(sandbox)
    with capsys.disabled():
        print(f"\nCLI fuzz ({what}): {len(cases)} cases, {len(failures)} failures, {len(slow)} over {CASE_LIMIT_S} s")
    assert not failures and not slow, "\n".join(failures + slow)


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working folder: the commands' default outputs (results/, runs/) would land here."""
    box = tmp_path / "cwd"
    box.mkdir()
    monkeypatch.chdir(box)
    return tmp_path


@pytest.mark.multiproc
def test_typed_value_errors_in_every_field_of_every_input_file(
    sandbox: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = sandbox / "inputs"
    files.mkdir()
    cases = [(label, argv, False) for label, argv in typed_value_cases(files)]
    assert len(cases) > 300
    _check_cases(cases, sandbox, capsys, "typed values in input files")


def test_unwritable_paths_for_every_output_flag(sandbox: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = [(label, argv, True) for label, argv in output_path_cases(sandbox)]
    assert len(cases) >= 60
    _check_cases(cases, sandbox, capsys, "unwritable output paths")


def test_huge_sizes_in_every_integer_flag(sandbox: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = huge_size_cases()
    assert len(cases) >= 60
    _check_cases(cases, sandbox, capsys, "huge sizes")


# --------------------------------------------------------------------------- odd terminals and backends
ENCODINGS = ("ascii", "latin-1")  # a login node in the C locale, an old Western-European one
BACKENDS = ("bogus", "qtagg")  # not a backend at all; one that needs a display this machine lacks


@pytest.mark.multiproc
@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_odd_locale_and_backend_degrade_never_crash(tmp_path: Path, encoding: str, backend: str) -> None:
    """`plan` prints × and – and plots: under a terminal that cannot encode them and any MPLBACKEND
    it prints replacement characters and writes the figure with Agg."""
    env = {**os.environ, "PYTHONIOENCODING": encoding, "LC_ALL": "C", "LANG": "C", "MPLBACKEND": backend}
    png = tmp_path / "p.png"
    argv = [
        sys.executable,
        "-m",
        "canzona",
        "plan",
        "--model",
        "qwen3-tiny",
        "--dp",
        "2",
        "--tp",
        "2",
        "--plot",
        str(png),
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, timeout=60, check=False)
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr.decode(errors="replace")[-500:]
    assert png.stat().st_size > 0 and b"?" in proc.stdout  # the dashes and crosses came out replaced
    assert time.perf_counter() - t0 < 60


def test_vocab_tp_does_not_divide_is_padded_not_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Round two once refused a vocabulary TP does not divide; Megatron-LM pads it (to a multiple of
    128·TP: 1001 at TP2 -> ceil(1001/256)·256 = 1024), and so do `models` and `plan`."""
    path = _files(tmp_path)["vocab_odd"]
    assert main(["models", path, "--tp", "2"]) == 0
    out = capsys.readouterr().out
    assert "embedding.word_embeddings.weight" in out and "(1024, 64)" in out and "(1001, 64)" not in out
    assert main(["plan", "--model", path, "--dp", "2", "--tp", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)


# --------------------------------------------------------------------------- results files
def test_cut_off_results_line_is_kept_apart_and_the_good_ones_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A results file ending in a cut-off line: the next record starts a new line (with a warning),
    and table2 reports the bad line and tables the good ones."""
    from canzona.results.schema import append_record, iter_records, validate

    good = (REPO / "results/table2-local.jsonl").read_text().splitlines()[:2]
    rec = json.loads(good[1])
    results = tmp_path / "r.jsonl"
    cut = good[1][: len(good[1]) // 2]
    results.write_text(good[0] + "\n" + cut)
    append_record(results, rec)
    assert "cut-off line" in capsys.readouterr().err
    lines = results.read_text().splitlines()
    # the partial line is untouched; the record is appended as the current schema version reads it
    assert lines == [good[0], cut, json.dumps(validate(rec), sort_keys=True)]
    reported: list[str] = []
    assert [n for n, _ in iter_records(results, report=reported.append)] == [1, 3]
    assert len(reported) == 1 and ":2:" in reported[0]
    assert main(["table2", "--results", str(results), str(tmp_path), "--out", str(tmp_path / "t2"), "--no-plots"]) == 0
    assert "r.jsonl:2" in capsys.readouterr().err  # reported; and the same file given twice read once


def test_make_plan_without_matrices_is_a_config_error() -> None:
    from canzona.errors import ConfigError
    from canzona.models import ParamSpec
    from canzona.plan import Layout, PlanConfig, make_plan

    for params in ([], [ParamSpec("decoder.final_layernorm.weight", (8,), None, "adamw")]):
        with pytest.raises(ConfigError, match="nothing to plan"):
            make_plan(params, Layout(dp=2), PlanConfig())
