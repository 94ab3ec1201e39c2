"""Run a function on N local ranks, each in its own process with a torch.distributed group.

How the ranks start depends on the backend (``start_method``):
* gloo (CPU) ranks are forked: children inherit modules the parent already imported (megatron
  takes seconds to import), so tests and local benchmarks start in well under a second;
* NCCL (GPU) ranks are spawned, fresh interpreters: nothing the parent did can have touched CUDA
  in them. See ``start_method`` for why not fork with NVML's availability check.
Under torchrun/srun use ``init_from_env`` instead; the rank function is the same.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import socket
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.context import ForkContext, SpawnContext
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from canzona.errors import ConfigError


class RankError(RuntimeError):
    """A rank raised; carries that rank's formatted traceback."""


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world: int
    local_rank: int
    device: torch.device


def free_port() -> int:
    """A TCP port free on this host now (for a rendezvous started next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cuda_visible() -> bool:
    """Whether this node has CUDA devices, asked WITHOUT initialising CUDA in this process.

    Why: a parent that forks its ranks must not initialise CUDA, or the ranks cannot use it
    (``torch.cuda.set_device`` fails with "Cannot re-initialize CUDA in forked subprocess", and a
    driver initialised by ``cudaGetDeviceCount`` in the parent is unusable in the children).
    ``torch.cuda.is_available()`` calls ``cudaGetDeviceCount``; ``torch.cuda.device_count()``
    asks NVML first (it falls back to the CUDA runtime only where NVML itself fails).
    """
    return torch.cuda.device_count() > 0


START_METHODS = {"gloo": "fork", "nccl": "spawn"}


def start_method(backend: str) -> str:
    """How ``launch`` starts ranks of ``backend``: "spawn" for NCCL, "fork" for gloo.

    Why spawn on GPUs: a CUDA query in the parent before the fork leaves children that fail at
    ``torch.cuda.set_device`` ("Cannot re-initialize CUDA in forked subprocess"), and libraries ask
    at import: megatron-core 0.19 calls ``torch.cuda.is_available()`` in
    ``megatron.core.dist_checkpointing.strategies.torch``, torchtitan through
    ``torch._utils._get_available_device_type`` in ``torchtitan.tools.utils``. torch's
    ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` would make ``is_available`` ask NVML instead, but it
    covers that one call only (not
    ``get_device_capability`` or whatever a later release asks at import), and where NVML fails it
    falls back to ``cudaGetDeviceCount``, which poisons the fork again. A spawned rank is a fresh
    interpreter, so no import in the parent, today's or a future one, reaches it. The price is
    that each GPU rank imports torch and megatron itself (seconds, beside minutes of a GPU run).
    Forking stays for gloo, where nothing initialises CUDA and start-up time is what tests pay.
    """
    try:
        return START_METHODS[backend]
    except KeyError:
        raise ConfigError(f"unknown backend {backend!r}: use one of {', '.join(START_METHODS)}") from None


def _device_for(local_rank: int, backend: str) -> torch.device:
    """This rank's device. NCCL ranks bind GPU ``local_rank % device_count()``: torchrun with all
    of a node's GPUs visible gives each rank its own GPU (local_rank < count), and under Slurm's
    per-task binding (--gpus-per-task=1, --gpu-bind=single:1 / map_gpu) each task sees one GPU as
    device 0, where ``set_device(local_rank)`` would fail."""
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"backend nccl needs CUDA, but torch {torch.__version__} sees none on this node; "
                "install a CUDA build of torch there (or use the profile's container image)"
            )
        index = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def init_from_env(backend: str | None = None, timeout_s: float = 600.0) -> RankInfo:
    """Join the group described by torchrun/srun variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*).

    ``backend`` None: nccl where CUDA is visible, else gloo. A caller that needs GPUs passes
    "nccl" and gets a ConfigError on a CUDA-less node, never a silent gloo run.
    """
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    device = _device_for(local, backend)
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
    return RankInfo(rank, world, local, device)


def _child(
    rank: int,
    nproc: int,
    port: int,
    backend: str,
    timeout_s: float,
    threads: int,
    fn: Callable[..., Any],
    args: tuple,
    out: Any,
) -> None:
    try:
        torch.set_num_threads(threads)
        os.environ.update(
            RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
        )
        device = _device_for(rank, backend)
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=nproc,
            timeout=timedelta(seconds=timeout_s),
        )
        result = fn(RankInfo(rank, nproc, rank, device), *args)
        # plain pickle copies tensors by value; torch's queue reducers would share memory
        # through file descriptors that die with this process
        out.put((rank, True, pickle.dumps(result)))
    except BaseException:  # noqa: BLE001 - report everything, including KeyboardInterrupt, to the parent
        out.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            # a broken group after a peer failure: nothing left to clean
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


def launch(
    fn: Callable[..., Any],
    nproc: int,
    *args: Any,
    backend: str = "gloo",
    timeout_s: float = 120.0,
    threads_per_rank: int | None = None,
) -> list[Any]:
    """Start ``nproc`` ranks (``start_method(backend)``), run ``fn(RankInfo, *args)`` in each, return
    results in rank order. Spawned ranks unpickle ``fn`` and ``args``: ``fn`` must be a module-level
    function.

    ``timeout_s`` bounds every collective (the process-group timeout) and, doubled, the whole
    run. Ranks run single-threaded by default: GNU OpenMP is not fork-safe, and a child whose
    parent already ran a parallel region hangs in its first one. If a rank raises, the others are
    stopped and ``RankError`` carries the first failing
    rank's traceback, so a failure never hangs the caller.
    """
    ctx = cast("SpawnContext | ForkContext", mp.get_context(start_method(backend)))
    out = ctx.Queue()
    port = free_port()
    threads = threads_per_rank or 1
    procs = [
        ctx.Process(target=_child, args=(r, nproc, port, backend, timeout_s, threads, fn, args, out), daemon=True)
        for r in range(nproc)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    failure: tuple[int, str] | None = None
    try:
        while len(results) < nproc and failure is None:
            try:
                rank, ok, payload = out.get(timeout=2 * timeout_s + 30)
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if not p.is_alive() and r not in results]
                failure = (
                    dead[0] if dead else -1,
                    f"no result within {2 * timeout_s + 30:.0f} s (ranks exited: {dead})",
                )
                break
            if ok:
                results[rank] = pickle.loads(payload)
            else:
                failure = (rank, payload)
    finally:
        for p in procs:
            p.join(timeout=5 if failure is None else 0.5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
    if failure is not None:
        rank, tb = failure
        raise RankError(f"rank {rank} of {nproc} failed:\n{tb}")
    return [results[r] for r in range(nproc)]
