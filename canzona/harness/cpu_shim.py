"""Run megatron-core on a machine WITHOUT a GPU: the one place where its CUDA calls are redirected.

Why this exists: megatron-core assumes CUDA in a handful of places even when a model is built
with ``use_cpu_initialization=True`` and every fusion is off. On our CPU machines (and in the
test suite) we still want the real megatron GPTModel, its TP layers and its pipeline
schedules, so instead of copying megatron code we redirect exactly these call sites:

1. ``torch.cuda.current_device()`` is called to pick a device for new tensors: rotary
   embedding (``inv_freq.to(torch.cuda.current_device())``), ``GlobalMemoryBuffer.get_tensor``,
   pipeline p2p receive buffers, attention-mask helpers. Without CUDA it raises; we make it
   return ``torch.device("cpu")``, which every one of those call sites accepts as a device.
2. The TP RNG tracker (``tensor_parallel/random.py``) seeds, saves and restores CUDA generator
   states; ``fork()`` is entered on every forward even with dropout 0. We install a tracker
   with the same interface that keeps CPU generator states instead.
3. ``torch.cuda.synchronize`` (megatron's p2p code calls it after batched isend/irecv) becomes a
   no-op: CPU ops are synchronous.
4. CUDA streams (megatron >= 0.19 DDP waits on ``torch.cuda.current_stream()`` and may run its
   reductions under ``torch.cuda.stream(...)``; the MoE all-to-all dispatcher copies its split
   sizes to the host on a side stream and synchronises on an event it records there): a CPU
   stand-in stream whose waits are no-ops (CPU work is ordered already), events that have always
   happened, and a ``stream()`` context that does nothing.
5. Hard-coded ``device="cuda"`` literals (the schedules' token counters, megatron DDP buffers):
   ``cuda_literals_to_cpu()`` is a context (a TorchFunctionMode) that the train loop enters
   around megatron's forward-backward schedule only (and the megatron-muon peer around its DDP
   and optimizer calls).
6. The MoE all-to-all dispatcher's device-to-host copy of its split sizes
   (``maybe_move_tensor_to_cpu(..., as_numpy=True)``, which converts only CUDA tensors): on the CPU
   the sizes stay tensors, which ``all_to_all_single`` rejects as split sizes; the stand-in hands
   them over as NumPy arrays, what the GPU path hands over.
7. ``torch.distributed.all_gather`` into parts of unequal size: gloo gathers equal parts only, and
   the MoE all-to-all dispatcher at expert TP > 1 gathers its tokens across the expert-TP ranks
   with as many rows as each received (megatron's ``gather_from_sequence_parallel_region`` with
   split sizes). The stand-in gathers parts padded to the largest and copies each out (the same
   values NCCL's uneven gather delivers); equal parts go straight through. Its counterpart,
   the uneven ``reduce_scatter`` back, gloo runs itself.
Not redirected, because the harness avoids the call instead: megatron's default causal-mask
helper (hard-codes CUDA) — the loop passes an explicit mask; batched p2p (synchronize) is off
on CPU via the model config.

What it deliberately does NOT do: it never touches anything when a GPU is present
(``install`` returns False), sets no environment variables, and copies no megatron code.
``uninstall`` restores the originals so tests can check both states.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

_ORIGINALS: dict[str, Any] = {}


def needed() -> bool:
    """True when there is no usable GPU, i.e. megatron's CUDA call sites must be redirected."""
    return not torch.cuda.is_available()


def installed() -> bool:
    return bool(_ORIGINALS)


def _cpu_current_device() -> torch.device:
    """Stand-in for ``torch.cuda.current_device``: megatron only uses the result as a device."""
    return torch.device("cpu")


def _make_cpu_tracker_class() -> type:
    """Build the CPU tracker as a subclass of megatron's so ``isinstance`` checks still hold."""
    from megatron.core.tensor_parallel import random as mrandom

    class CpuRNGStatesTracker(mrandom.CudaRNGStatesTracker):
        """megatron's RNG-states tracker with CPU generator states instead of CUDA ones.

        Same bookkeeping (named states, distinct seeds, fork/restore); only the generator changes.
        Dropout inside ``fork()`` (TP regions) then draws from a per-TP-rank CPU stream, just as it
        draws from a per-TP-rank CUDA stream on GPU.
        """

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["use_cudagraphable_rng"] = False
            super().__init__(*args, **kwargs)

        def add(self, name: str, seed: int) -> None:
            self._is_initialized = True
            if seed in self.seeds_:
                raise Exception(f"seed {seed} already exists")
            self.seeds_.add(seed)
            if name in self.states_:
                raise Exception(f"rng state {name} already exists")
            gen = torch.Generator(device="cpu")
            gen.manual_seed(seed)
            self.states_[name] = gen.get_state()

        @contextlib.contextmanager
        def fork(self, name: str = mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME) -> Iterator[None]:
            if name not in self.states_:
                raise Exception(f"rng state {name} is not added")
            orig = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(orig)

    return CpuRNGStatesTracker


def install() -> bool:
    """Redirect megatron's CUDA call sites to the CPU if (and only if) no GPU is present.

    Idempotent; returns True when the shim is active. Call it BEFORE building the model and
    before ``model_parallel_cuda_manual_seed``.
    """
    if not needed():
        return False
    if installed():
        return True
    from megatron.core.tensor_parallel import random as mrandom

    _ORIGINALS["current_device"] = torch.cuda.current_device
    _ORIGINALS["tracker"] = (mrandom._CUDA_RNG_STATE_TRACKER, mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED)
    _ORIGINALS["manual_seed"] = torch.cuda.manual_seed
    _ORIGINALS["synchronize"] = torch.cuda.synchronize
    torch.cuda.synchronize = _noop_synchronize
    for name, repl in _STREAM_PATCHES.items():
        _ORIGINALS["stream:" + name] = getattr(torch.cuda, name)
        setattr(torch.cuda, name, repl)
    from megatron.core.transformer.moe import token_dispatcher

    _ORIGINALS["to_host"] = token_dispatcher.maybe_move_tensor_to_cpu
    token_dispatcher.maybe_move_tensor_to_cpu = _to_host
    _ORIGINALS["all_gather"] = dist.all_gather
    dist.all_gather = _all_gather_padded
    torch.cuda.current_device = _cpu_current_device  # type: ignore[assignment]  # a device where torch says int; megatron uses it as a device
    # model_parallel_cuda_manual_seed calls torch.cuda.manual_seed for the default stream; on
    # CPU the default stream IS the CPU generator, which the harness seeds itself.
    torch.cuda.manual_seed = _noop_seed
    mrandom._CUDA_RNG_STATE_TRACKER = _make_cpu_tracker_class()()
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    return True


class _CudaLiteralsToCpu(torch.overrides.TorchFunctionMode):
    """Rewrites ``device="cuda"`` (or cuda:N) arguments to the CPU for every torch call it sees.

    Needed for the few literals that no function patch can reach (megatron's pipeline schedules
    create ``torch.zeros([], device="cuda")`` token counters; megatron's DDP allocates its grad
    buffers with ``device=torch.cuda.current_device()``; its distributed optimizer checks
    ``param.type() == "torch.cuda.FloatTensor"``, answered with the GPU name). It is a
    context, entered only around the code that needs it, because a function mode adds Python
    overhead to every forward op.
    """

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        dev = kwargs.get("device")
        if dev is not None and _is_cuda(dev):
            kwargs = dict(kwargs, device="cpu")
        if func in _TO_FUNCS and args[1:] and _is_cuda(args[1]):
            args = (args[0], "cpu", *tuple(args[2:]))
        if func is torch.Tensor.type and not args[1:] and not kwargs:
            # the type check of megatron's distributed optimizer ("torch.cuda.FloatTensor"), answered
            # with the name the same tensor has on a GPU; a conversion (an argument) passes through
            name = str(func(*args))
            return name.replace("torch.", "torch.cuda.", 1) if args[0].device.type == "cpu" else name
        return func(*args, **kwargs)


def _is_cuda(dev: Any) -> bool:
    if isinstance(dev, torch.device):
        return dev.type == "cuda"
    if isinstance(dev, str):
        return dev.startswith("cuda")
    return False


_TO_FUNCS = {torch.Tensor.to}


@contextlib.contextmanager
def cuda_literals_to_cpu() -> Iterator[None]:
    """Map hard-coded CUDA device literals to the CPU inside the block; a no-op when the shim is off."""
    if not installed():
        yield
        return
    with _CudaLiteralsToCpu():
        yield


def _noop_seed(seed: int) -> None:
    """CPU stand-in for ``torch.cuda.manual_seed`` (there is no CUDA generator to seed)."""


class CpuEvent:
    """What ``CpuStream.record_event`` returns: an event that has always happened (megatron's MoE
    all-to-all dispatcher records one on its device-to-host stream and synchronises on it)."""

    def synchronize(self) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True


class CpuStream:
    """Stand-in for ``torch.cuda.Stream`` on the CPU: every wait/sync is a no-op because CPU
    kernels run in program order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def wait_stream(self, stream: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def record_event(self, event: Any = None) -> Any:
        return CpuEvent() if event is None else event


def _cpu_current_stream(device: Any = None) -> CpuStream:
    return CpuStream()


def _cpu_stream_context(stream: Any = None) -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext()


_STREAM_PATCHES: dict[str, Any] = {
    "current_stream": _cpu_current_stream,
    "stream": _cpu_stream_context,
    "Stream": CpuStream,
}


def _to_host(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
    """CPU stand-in for the dispatcher's ``maybe_move_tensor_to_cpu``: the tensor is on the host
    already; as NumPy when asked, as the GPU path returns it."""
    return tensor.numpy() if as_numpy and torch.is_tensor(tensor) else tensor


def _all_gather_padded(
    tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: Any = None, async_op: bool = False
) -> Any:
    """CPU stand-in for ``torch.distributed.all_gather`` that also takes parts of unequal first
    dimension (gloo refuses them): each rank's part padded to the largest, gathered, cut back,
    synchronously (megatron's uneven gather is a synchronous call)."""
    gather = _ORIGINALS["all_gather"]
    if all(t.shape == tensor.shape for t in tensor_list):
        return gather(tensor_list, tensor, group=group, async_op=async_op)
    rows = max(t.shape[0] for t in tensor_list)
    padded = tensor.new_zeros((rows, *tensor.shape[1:]))
    padded[: tensor.shape[0]] = tensor
    parts = [torch.empty_like(padded) for _ in tensor_list]
    gather(parts, padded, group=group)
    for out, part in zip(tensor_list, parts, strict=True):
        out.copy_(part[: out.shape[0]])
    return None


def _noop_synchronize(device: Any = None) -> None:
    """CPU stand-in for ``torch.cuda.synchronize``: CPU kernels have already finished."""


def uninstall() -> None:
    """Restore everything ``install`` replaced (tests use it to leave the process clean)."""
    if not installed():
        return
    from megatron.core.tensor_parallel import random as mrandom

    torch.cuda.current_device = _ORIGINALS["current_device"]
    torch.cuda.manual_seed = _ORIGINALS["manual_seed"]
    torch.cuda.synchronize = _ORIGINALS["synchronize"]
    from megatron.core.transformer.moe import token_dispatcher

    token_dispatcher.maybe_move_tensor_to_cpu = _ORIGINALS["to_host"]
    dist.all_gather = _ORIGINALS["all_gather"]
    for name in _STREAM_PATCHES:
        setattr(torch.cuda, name, _ORIGINALS["stream:" + name])
    mrandom._CUDA_RNG_STATE_TRACKER, mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = _ORIGINALS["tracker"]
    _ORIGINALS.clear()


__all__: list[str] = ["install", "installed", "needed", "uninstall"]
