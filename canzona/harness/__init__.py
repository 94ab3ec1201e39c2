"""Megatron training harness: Qwen3 on megatron-core's GPTModel, trained with Canzona's
distributed optimizer (or Megatron's own Muon as a peer), timed, and recorded as one results line.

  config.py        named run configurations (configs/*.toml) that load into canzona.spec.RunSpec
  cpu_shim.py      the ONE module that redirects megatron's CUDA calls when there is no GPU
  model.py         the model (megatron GPTModel + layout-invariant init); no parallelisation logic
  params.py        megatron params -> (name, full-shape ParamSpec, local param)
  train.py         the loop, top to bottom
  timing.py        per-iteration timers, cross-rank max, median/p90, tokens/s, model TFLOP/s
  record.py        the results record
  collectives.py   the collective calls an iteration issues, by group role and kind
  peer_megatron.py the Megatron peers: megatron-muon, megatron-layerwise (its layer-wise optimizer)
  gpu_train.py     `canzona gpu-check`'s training part: one in-process rank, step probe, memory-model prediction
  dry_run.py       `canzona dry-run`: one rank of a real layout with fake tensors on a fake process group
  live_bytes.py    its count of live tensor bytes per phase (a dispatch mode)
  gpu_summary.py   its SUMMARY.md and goal verdicts, computed from the JSON files
  step_probe.py    host syncs (CUDA sync-debug warnings / host reads) and allocator around opt.step()
  torchtitan_*.py  torchtitan integration: its Qwen3 under FSDP2 (qwen3), Canzona as its trainer's
                   optimizer container (trainer), that trainer on CPU (cpu)
The commands (`canzona train`, `canzona gpu-check`, `canzona dry-run`) are in canzona.commands.
Heavy imports (megatron) happen inside functions, so importing this package is cheap.
"""
