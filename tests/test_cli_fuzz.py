"""No traceback for user error, anywhere in the CLI: a table of bad inputs for every command, plus
random junk in numeric flags. Each must exit 2 with ONE line on stderr (argparse's usage included)
and start no work. The count is printed (``pytest -s`` shows it) and must stay >= 100."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from canzona.cli import main
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
    return {
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
