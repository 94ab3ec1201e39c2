"""Every command of ``canzona`` (the top layer: no library package imports a command).

``cli`` is the table of ``canzona --help`` (``COMMANDS``: name -> module, imported by name only when
that command runs) and ``main``; each command module exposes ``configure(parser)`` and
``run(args) -> int``:

  models          `canzona models`
  plan            `canzona plan` (its text reports: plan_report, fsdp2_report; its figures: plan_plot)
  plan_bench      `canzona plan-bench` (its suites: bench_coop, bench_goals, bench_held_out, bench_moe)
  train           `canzona train` (torchrun/srun rank, or forked local gloo ranks)
  bench_step      `canzona bench-step`
  bench_fsdp2     `canzona bench-fsdp2`
  bench_ns        `canzona bench-ns`
  gpu_check       `canzona gpu-check`: one GPU in <= 8 min (wheels install, parts, budget)
  sweep           `canzona sweep`
  table2          `canzona table2`
  project         `canzona project`
  calibrate       `canzona calibrate-cpu`
  soak            ``python -m canzona.commands.soak`` (`make soak`)
"""
