"""What the harness does after the training loop: the results line comes first, the replica check
after it, in O(largest tensor) extra memory, and a failing check never costs the line.

Why measured on a model "large enough to tell apart": the check used to build a float64 copy of
every parameter plus two clones and a difference (~32 bytes per parameter, ~128 GB per GPU at
Qwen3-4B TP1) before rank 0 wrote the line, so an OOM there lost every measured cell. Here 32
tensors of 512×1024 fp32 (64 MiB, the largest 2 MiB) on two DP ranks: O(model) extra memory is
hundreds of MiB, O(largest tensor) a few MiB. Memory is the process's peak RSS (ru_maxrss, the
CPU figure the records use), read before and after in each forked rank, with glibc's mmap threshold
pinned at 64 KiB: by default glibc raises it after the first large free and then keeps freed
tensors in its heap, so RSS would count memory the program already gave back.
"""

from __future__ import annotations

import ctypes
import gc
import json
import resource
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from canzona.harness.params import NamedParam, replica_divergence
from canzona.harness.record import checks_path
from canzona.harness.timing import IterationLog
from canzona.models.spec import ParamSpec
from canzona.runtime.launch import launch
from canzona.spec import RunSpec

pytestmark = [pytest.mark.megatron, pytest.mark.multiproc]

TENSORS, ROWS, COLS = 32, 512, 1024
MODEL_BYTES = TENSORS * ROWS * COLS * 4
LARGEST_BYTES = ROWS * COLS * 4
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


class _Opt:
    """The two things ``finish`` asks of an optimizer after the loop."""

    layer_wise = None

    def wait_param_sync(self) -> None: ...


def _named(n: int, rows: int, cols: int) -> list[NamedParam]:
    out = []
    for i in range(n):
        p = torch.nn.Parameter(torch.full((rows, cols), 0.5 + i, dtype=torch.float32))  # pages touched
        out.append((f"w{i}", ParamSpec(f"w{i}", (rows, cols), 0, "matrix", None), p))
    return out


def _log() -> IterationLog:
    log = IterationLog()
    for _ in range(3):
        log.add(3.0, 2.0, 1.0, {"compute": 0.5}, 1.0)
    return log


def _pin_mmap_threshold() -> None:
    """Every allocation above 64 KiB its own mapping, returned to the OS when freed (glibc only)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        pytest.skip("needs glibc (mallopt) to read freed tensors out of the peak RSS")
    assert libc.mallopt(M_MMAP_THRESHOLD, 64 * 1024) == 1


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _measured(ri: Any, run: RunSpec, results: str, what: str) -> int:
    """Peak RSS growth of ``what`` ("finish": everything after the loop; "check": the replica check
    alone) on this rank, after a warm-up on one tiny tensor (imports, gloo buffers)."""
    from canzona.harness.train import finish

    _pin_mmap_threshold()
    world = dist.new_group(list(range(ri.world)))
    solo = dist.new_group([ri.rank], use_local_synchronization=True)
    tiny = _named(1, 4, 4)
    finish(ri, run, _Opt(), tiny, _log(), "gloo", world, solo)
    named = _named(TENSORS, ROWS, COLS)
    gc.collect()
    before = _peak_rss_bytes()
    if what == "finish":
        out = finish(ri, run, _Opt(), named, _log(), "gloo", world, solo, results=results)
        assert out["checks"] == {"replica_max_abs_diff": 0.0}
    else:
        assert replica_divergence(named, world, solo) == 0.0
    return _peak_rss_bytes() - before


@pytest.mark.parametrize("what", ["check", "finish"])
def test_bookkeeping_after_the_loop_is_o_largest_tensor(tmp_path: Path, what: str) -> None:
    run = RunSpec(model="qwen3-micro").replace(dp=2, global_batch=2)
    grown = launch(_measured, 2, run.resolve(gpu=False), str(tmp_path / "r.jsonl"), what, timeout_s=120)
    # O(model) would be >= MODEL_BYTES (one fp32 copy; the old check took ~8x that); allow four
    # float64 copies of the largest tensor plus 8 MiB of allocator and page slack
    limit = 4 * 2 * LARGEST_BYTES + 8 * 2**20
    assert max(grown) < limit < MODEL_BYTES, f"peak RSS grew {[g >> 20 for g in grown]} MiB (limit {limit >> 20})"


def _differ(ri: Any) -> float:
    named = _named(3, 8, 8)
    if ri.rank == 1:
        with torch.no_grad():
            named[1][2][2, 3] += 0.25
    world = dist.new_group(list(range(ri.world)))
    solo = dist.new_group([ri.rank], use_local_synchronization=True)
    return replica_divergence(named, world, solo)


def test_replica_check_still_finds_a_difference() -> None:
    """The checksum only picks which tensors to compare; the number is still the max |difference|."""
    assert launch(_differ, 2, timeout_s=60) == [pytest.approx(0.25)] * 2


def _fails(*_: Any) -> float:
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 120.00 GiB")


def test_a_failing_check_keeps_the_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`canzona train` on two DP ranks whose replica check runs out of memory: the run exits 0, its
    results line is there and the check's failure is recorded beside it."""
    pytest.importorskip("megatron.core")
    import megatron.core.models.gpt  # noqa: F401 - import before the CLI forks ranks

    import canzona.harness.train
    from canzona.commands.cli import main as canzona_main
    from canzona.results import schema

    monkeypatch.setattr(canzona.harness.train, "replica_divergence", _fails)  # the forked ranks inherit it
    results = tmp_path / "train.jsonl"
    argv = ["train", "--model", "qwen3-micro", "--dp", "2", "--global-batch", "2", "--seq-len", "16"]
    assert canzona_main([*argv, "--warmup", "0", "--iters", "1", "--results", str(results)]) == 0
    (line,) = [r for _, r in schema.iter_records(results)]
    check = json.loads(checks_path(results).read_text())
    assert check["cell"] == line["cell"]
    assert check["checks"]["replica_check_error"].startswith("OutOfMemoryError: CUDA out of memory")


_ALL_GATHER_OBJECT = dist.all_gather_object


def _gather_fails(out: list[Any], obj: Any, *args: Any, **kwargs: Any) -> None:
    """all_gather_object that fails for the end-of-run gather alone (set-up uses it too)."""
    if isinstance(obj, dict) and "host" in obj:
        raise RuntimeError("Connection closed by peer")
    _ALL_GATHER_OBJECT(out, obj, *args, **kwargs)


def test_a_failing_end_of_run_gather_keeps_the_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The end-of-run gather (every rank's host and plan summary) fails on every rank: the run exits
    0 and its line is written, with a plan section saying why it is missing."""
    pytest.importorskip("megatron.core")
    import megatron.core.models.gpt  # noqa: F401 - import before the CLI forks ranks

    from canzona.commands.cli import main as canzona_main
    from canzona.results import schema

    monkeypatch.setattr(dist, "all_gather_object", _gather_fails)  # the forked ranks inherit it
    results = tmp_path / "train.jsonl"
    argv = ["train", "--model", "qwen3-micro", "--dp", "2", "--global-batch", "2", "--seq-len", "16"]
    assert canzona_main([*argv, "--warmup", "0", "--iters", "1", "--results", str(results)]) == 0
    (line,) = [r for _, r in schema.iter_records(results)]
    assert line["plan"]["stages"] is None
    assert line["plan"]["missing"].startswith("the end-of-run gather of every rank's host and plan failed")
    assert "Connection closed by peer" in line["plan"]["missing"] and len(line["env"]["hostnames"]) == 1


def _reads(ri: Any, n: int) -> tuple[list[str], list[str]]:
    """Host reads and collectives of the replica check on ``n`` identical tensors."""
    from canzona.harness.step_probe import HostReadCounter

    named = _named(n, 8, 8)
    world = dist.new_group(list(range(ri.world)))
    solo = dist.new_group([ri.rank], use_local_synchronization=True)
    real, issued = dist.all_reduce, []

    def all_reduce(t: torch.Tensor, *a: Any, **k: Any) -> Any:
        issued.append(f"all_reduce {t.numel()}")
        return real(t, *a, **k)

    dist.all_reduce = all_reduce
    try:
        with HostReadCounter() as c:
            replica_divergence(named, world, solo)
    finally:
        dist.all_reduce = real
    return c.calls, issued


def test_replica_check_syncs_do_not_grow_with_the_model() -> None:
    """At 256 GPUs the check must stay a handful of small collectives: one MAX and one MIN of 2n
    checksums per group, one final MAX, and host reads that do not depend on the tensor count."""
    for n in (2, 20):
        reads, issued = launch(_reads, 2, n, timeout_s=60)[0]
        assert reads == ["tolist in canzona.harness.params", "__float__ in canzona.harness.params"], reads
        assert issued == [f"all_reduce {2 * n}", f"all_reduce {2 * n}", "all_reduce 1"], issued
