"""How the tests run each command the README and the docs print (issue #38).

A command printed as-is runnable (no ``[options]``, ``{a,b}`` or placeholders, seconds to run) is
not listed: it runs exactly as printed. Every other command is listed with the forms that run in
its place and why: sizes shrink (fewer steps, a smaller model, one suite), output goes to a fresh
folder (``{tmp}``) instead of the committed results, and what needs Slurm, a GPU or minutes runs
as ``make -n`` (make's own dry run: the recipe exists and resolves), ``--dry-run`` or ``--help``.
Flags are never dropped: tests/test_doc_commands.py checks that every flag of the printed command
is in one of its forms, unless ``dropped`` names it with why.

Placeholders in a form: ``{tmp}`` an empty folder, ``{wheels}`` a folder holding one empty
``*.whl`` file (a ``gpu-check --dry-run`` lists the wheels it would install and reads nothing else
of them), ``{py}`` this interpreter (``canzona`` at the
start of a form runs this checkout's CLI in the test process; ``make`` and the others run in a
shell). ``marks`` are the pytest markers the forms need (tests/conftest.py enforces them; a command that
records the environment runs `git rev-parse`, a subprocess)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Forms:
    runs: tuple[str, ...]
    why: str
    marks: tuple[str, ...] = ()
    dropped: dict[str, str] = field(default_factory=dict)


_MINUTES = "takes minutes (docs/reproduce-table2.md's timing table); `make -n` checks the recipe resolves, nothing runs"
MICRO_TRAIN = "--seq-len 16 --micro-batch 1 --global-batch 2 --warmup 1 --iters 2"

FORMS: dict[str, Forms] = {
    # --- README.md, Set up
    "make reproduce-table2": Forms(
        ("make -n reproduce-table2 CLUSTER=local", "{py} experiments/reproduce_table2.py --help"),
        f"the main job {_MINUTES}; its sweep and bench steps run for real in tests/test_reproduce_here.py",
        ("multiproc",),
    ),
    "make test": Forms(("make -n test",), "the suite itself: running it here would recurse", ("multiproc",)),
    "make test-fast": Forms(("make -n test-fast",), "a subset of the suite itself", ("multiproc",)),
    # --- docs/usage.md
    "canzona models [qwen3-32b | llama-3-8b | FILE]": Forms(
        (
            "canzona models",
            "canzona models qwen3-32b",
            "canzona models llama-3-8b",
            "canzona models canzona/models/configs/mistral-nemo-12b.json",
            "canzona models canzona/models/configs/qwen3-tiny-widefc1.toml",
        ),
        "one run per alternative; FILE as a shipped HuggingFace config.json and a TOML inventory",
    ),
    "canzona plan --model qwen3-32b --tp 8 --pp 1 --dp 32 --optimizer muon --strategy canzona --alpha 0.5 "
    "--cost flops [--json] [--plot load.png] [--compare] [--save plan.json]": Forms(
        (
            "canzona plan --model qwen3-32b --tp 8 --pp 1 --dp 32 --optimizer muon --strategy canzona --alpha 0.5"
            " --cost flops --plot {tmp}/load.png --compare --save {tmp}/plan.json",
            "canzona plan --model qwen3-32b --tp 8 --pp 1 --dp 32 --optimizer muon --strategy canzona --alpha 0.5"
            " --cost flops --json",
        ),
        "the options in two runs (--json prints one object), files into a fresh folder",
    ),
    "canzona plan --engine fsdp2 --model qwen3-32b --dp 256 [--shard-group 8] [--tp T] [--json]": Forms(
        (
            "canzona plan --engine fsdp2 --model qwen3-32b --dp 256 --shard-group 8 --json",
            "canzona plan --engine fsdp2 --model qwen3-32b --dp 256 --tp 2",
        ),
        "the options in two runs; T = 2",
    ),
    "canzona plan-bench --out results/planner [--suite qwen3|comm|models|coop|held-out]": Forms(
        (
            "canzona plan-bench --out {tmp}/planner --suite qwen3 --models qwen3-1.7b --layouts qwen3-1.7b:8:1"
            " --no-plots",
            "canzona plan-bench --help",
        ),
        "every suite takes minutes at 256 GPUs: the qwen3 suite on one model and layout, the other suite names"
        " checked in --help (`make planner-bench` runs them all)",
        ("multiproc",),
    ),
    "canzona plan-bench --suite moe --suite moe-balance --out results/planner": Forms(
        ("canzona plan-bench --help",),
        "the MoE suites plan Qwen3-235B-A22B (24k matrices) at 256 and 1024 GPUs: minutes; tests/test_plan_ep.py"
        " plans docs/usage.md's MoE layouts, --help lists the suites",
        dropped={"--suite": "moe and moe-balance take minutes (see why)", "--out": "nothing is written by --help"},
    ),
    "canzona plan-bench --suite fsdp2 --out results/fsdp2_plan": Forms(
        ("canzona plan-bench --suite fsdp2 --models qwen3-1.7b --out {tmp}/fsdp2_plan --no-plots",),
        "one model instead of Qwen3 1.7B-32B",
        ("multiproc",),
    ),
    "canzona bench-step --nproc 4 --dp 2 --tp 2 --model qwen3-tiny --optimizer muon --steps 20 --json "
    "[--strategies sc,layerwise,asc,canzona,canzona:cooperative=false] [--dtype bf16] [--ns-dtype fp32]": Forms(
        (
            "canzona bench-step --nproc 4 --dp 2 --tp 2 --model qwen3-micro --optimizer muon --steps 2 --warmup 1"
            " --json --strategies sc,layerwise,asc,canzona,canzona:cooperative=false --dtype bf16 --ns-dtype fp32",
        ),
        "qwen3-micro, 2 steps: 4 forked gloo ranks",
        ("multiproc",),
    ),
    "canzona bench-step --nproc 4 --model qwen3-moe-tiny --dp 4 --tp 1 --ep 2 --optimizer muon --steps 20": Forms(
        (
            "canzona bench-step --nproc 4 --model qwen3-moe-micro --dp 4 --tp 1 --ep 2 --optimizer muon --steps 1"
            " --warmup 0",
        ),
        "qwen3-moe-micro, one step: qwen3-moe-tiny's 20 take minutes on 4 forked gloo ranks (`make bench-step`)",
        ("multiproc",),
    ),
    "canzona bench-fsdp2 --nproc 4 --steps 10": Forms(
        ("canzona bench-fsdp2 --nproc 4 --steps 2 --warmup 1 --model qwen3-micro --layers 1 --seq 16",),
        "torchtitan's Qwen3 at qwen3-micro's size, one layer, 2 steps: 4 forked gloo ranks (importing"
        " torchtitan in each rank is most of its time)",
        ("multiproc",),
    ),
    "canzona bench-ns --shapes 512x5120,1024x1024 --methods standard,gram,auto,torch,emerging --dtype fp32": Forms(
        (
            "canzona bench-ns --shapes 64x320,64x64 --repeats 1"
            " --methods standard,gram,auto,torch,emerging --dtype fp32",
        ),
        "the same long and square aspect at 1/8 the size, one timed call",
        ("multiproc",),
    ),
    "canzona dry-run --model qwen3-32b --tp 8 --dp 32 --dtype bf16 [--rank R] [--json]": Forms(
        ("canzona dry-run --model qwen3-tiny --tp 2 --dp 2 --dtype bf16 --rank 3 --json",),
        "a rank of Qwen3-32B takes 20 s here; the same flags on qwen3-tiny at TP 2 · DP 2 (2 s), both options in one",
    ),
    "canzona train --model qwen3-tiny --tp 2 --pp 1 --dp 2 --method canzona --optimizer muon --seq-len 128 "
    "--micro-batch 1 --global-batch 8 --warmup 2 --iters 8 --results results/train.jsonl --nproc 4": Forms(
        (
            f"canzona train --model qwen3-micro --tp 2 --pp 1 --dp 2 --method canzona --optimizer muon {MICRO_TRAIN}"
            " --results {tmp}/train.jsonl --nproc 4",
        ),
        "qwen3-micro, 2 iterations of 2 sequences of 16 tokens: 4 forked gloo ranks on megatron-core",
        ("multiproc", "megatron"),
    ),
    "canzona train --model qwen3-moe-micro --dp 4 --ep 2 --method canzona --optimizer muon --seq-len 16 "
    "--micro-batch 1 --global-batch 8 --warmup 1 --iters 4 --nproc 4": Forms(
        (
            "canzona train --model qwen3-moe-micro --dp 4 --ep 2 --method canzona --optimizer muon --seq-len 16"
            " --micro-batch 1 --global-batch 4 --warmup 1 --iters 2 --nproc 4",
        ),
        "2 iterations of 4 sequences: 4 forked gloo ranks on megatron-core's MoE layer",
        ("multiproc", "megatron"),
    ),
    "canzona sweep {show,run,status,collect} slurm/sweeps/table2.toml [--backend slurm --profile P --dry-run]": Forms(
        (
            "canzona sweep show slurm/sweeps/table2.toml",
            "canzona sweep run slurm/sweeps/table2.toml --backend slurm --profile slurm/profiles/example.toml"
            " --dry-run --out {tmp}/dry --runs-dir {tmp}/runs --results-dir {tmp}/results",
            "canzona sweep status slurm/sweeps/table2.toml --runs-dir {tmp}/runs --results-dir {tmp}/results",
            "canzona sweep collect slurm/sweeps/table2.toml --runs-dir {tmp}/runs --results-dir {tmp}/results",
        ),
        "each action; Slurm only as its dry run (renders the job scripts, submits nothing), P = the example profile",
    ),
    "canzona project --preset paper --out results/": Forms(
        ("canzona project --preset paper --profile H800 --out {tmp}",),
        "the paper preset on its headline profile only (every profile: ~1 min)",
        ("multiproc",),
    ),
    "canzona project --preset moe --out results/": Forms(
        ("canzona project --help",),
        "the MoE preset plans Qwen3-235B-A22B (94 layers, 8 stages) at 256 and 1024 GPUs for every method: about five"
        " minutes on one core; tests/test_projection_moe.py checks its scenarios and projects an EP layout",
        dropped={"--preset": "moe takes minutes (see why)", "--out": "nothing is written by --help"},
    ),
    "canzona project --model qwen3-30b-a3b --tp 2 --dp 128 --ep 8 --overlap megatron": Forms(
        ("canzona project --model qwen3-moe-micro --tp 1 --dp 4 --ep 2 --overlap megatron --global-batch 8",),
        "the same flags on the 2-layer MoE model (Qwen3-30B-A3B's sc plan alone takes about 20 s)",
    ),
    "canzona project --preset authors --out results/": Forms(
        ("canzona project --preset authors --out {tmp}",),
        "into a fresh folder, not the committed results",
        ("multiproc",),
    ),
    "canzona table2 --results results/ --out results/": Forms(
        ("canzona table2 --results results/ --out {tmp} --no-plots",),
        "the committed lines into a fresh folder; the figures take minutes on a loaded VM and are rendered and"
        " checked by tests/test_analysis_figures.py",
    ),
    "make notebook": Forms(
        ("make -n notebook",),
        "tests/test_analysis_outputs.py executes analysis/table2.ipynb from both starting folders",
        ("multiproc",),
    ),
    "canzona gpu-check --out DIR [--wheels .whl] [--quick]": Forms(
        ("canzona gpu-check --out {tmp}/gpu --wheels {wheels} --quick --dry-run",),
        "needs a GPU and 8 minutes: its dry run prints the install commands and the budget",
    ),
    # --- docs/fsdp2.md, In torchtitan
    "torchrun --nproc-per-node 8 -m torchtitan.train --module examples.torchtitan_canzona "
    "--config canzona_qwen3_micro": Forms(
        ("{py} -m torchtitan.config.manager --module examples.torchtitan_canzona --config canzona_qwen3_micro",),
        "torchtitan's Trainer needs a GPU per rank (it calls torch.cuda.set_device, trainer.py:301): its config "
        "manager parses the same job; the CPU command beside it runs the job through the trainer's builders",
        ("multiproc",),
        dropped={"--nproc-per-node": "8 ranks of torchtitan.train need 8 GPUs"},
    ),
    # --- docs/gpu-check.md
    "timeout -k 10 470 python3 -m canzona gpu-check --wheels .whl --out results/gpu": Forms(
        ("timeout -k 10 120 {py} -m canzona gpu-check --wheels {wheels} --out {tmp}/gpu --dry-run",),
        "the GPU machine's one command, as its dry run, under the same timeout wrapper",
        ("multiproc",),
    ),
    # --- slurm/README.md
    "canzona sweep show slurm/sweeps/table2.toml [--profile P.toml]": Forms(
        ("canzona sweep show slurm/sweeps/table2.toml --profile slurm/profiles/example.toml",),
        "P = the example profile",
    ),
    "canzona sweep run slurm/sweeps/local.toml": Forms(
        (
            "canzona sweep run slurm/sweeps/local.toml --only method=canzona --only ns_dtype=fp32 --only tp=2"
            " --only model=qwen3-tiny --runs-dir {tmp}/runs --results-dir {tmp}/results --no-progress",
        ),
        "one of its cells (qwen3-tiny, 4 forked gloo ranks) into fresh folders; Newton–Schulz in fp32, since a "
        "CPU without AVX-512 BF16 emulates bf16 matmuls (19 s here, where the bf16 cell ran past its 240 s limit)",
        ("multiproc", "megatron"),
    ),
    "canzona sweep run slurm/sweeps/table2.toml --backend slurm --profile P.toml --dry-run [--out DIR]": Forms(
        (
            "canzona sweep run slurm/sweeps/table2.toml --backend slurm --profile slurm/profiles/example.toml"
            " --dry-run --out {tmp}/dry --runs-dir {tmp}/runs",
        ),
        "P = the example profile, DIR a fresh folder",
    ),
    "canzona sweep run slurm/sweeps/table2.toml --backend slurm --profile P.toml [--allocation model|cell] "
    "[--wait] [--force]": Forms(
        (
            "canzona sweep run slurm/sweeps/table2.toml --backend slurm --profile slurm/profiles/example.toml"
            " --allocation cell --dry-run --out {tmp}/dry --runs-dir {tmp}/runs",
            "canzona sweep run --help",
        ),
        "submitting needs a Slurm cluster: the dry run renders the scripts (--allocation cell), --help lists"
        " --wait and --force (tests/slurm runs them on a real Slurm, `make test-slurm`)",
        dropped={"--wait": "waits on submitted jobs; --help lists it", "--force": "resubmits jobs; --help lists it"},
    ),
    "canzona sweep status slurm/sweeps/table2.toml": Forms(
        ("canzona sweep status slurm/sweeps/table2.toml --runs-dir {tmp}/runs --results-dir {tmp}/results",),
        "in fresh folders (nothing submitted yet)",
    ),
    "canzona sweep collect slurm/sweeps/table2.toml": Forms(
        ("canzona sweep collect slurm/sweeps/table2.toml --runs-dir {tmp}/runs --results-dir {tmp}/results",),
        "into a fresh folder, not the committed results",
    ),
}
