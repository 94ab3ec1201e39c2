# Canzona: the two entry points of a fresh machine are `make reproduce-table2` and `make test`.
# Both create .venv on first use. torch==2.13.0 is installed FIRST (a local CPU build on our
# machines) so that no later dependency can resolve a CUDA torch; on a GPU cluster set
# TORCH_SPEC to the torch you want (e.g. TORCH_SPEC='torch>=2.4').
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
TORCHTITAN_SPEC ?= torchtitan==0.3.0
TORCHDATA_SPEC ?= torchdata==0.11.0
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.canzona-installed
# Both environments install this tree in editable mode, which writes canzona.egg-info here: one at a
# time when reproduce-table2 builds them side by side.
EDITABLE_LOCK := .canzona-editable.lock
# -n 2: one worker per core; worksteal: a worker that ran out of tests takes half of the other's
# queue, so the suite does not end on one worker's tail of multi-rank tests; --durations=25 prints
# the slowest tests, where a change that slowed the suite shows first.
PYTEST_ARGS ?= -n 2 -q --dist worksteal --durations=25
# make test's wall-time budget on the 2-core machine, lint included (issue #47; docs/CONTRIBUTING.md)
TEST_BUDGET_S ?= 600

.PHONY: help install lint test test-fast test-hypothesis test-slurm slurm-up slurm-down mutants reproduce-table2 table2 notebook planner-bench bench-step bench-ns soak clean-venv megatron-peer-env gpu-check gpu-wheels

help:
	@echo "make reproduce-table2   run the Table-2 reproduction (Slurm if present, else the embedded local default; FULL=1: every suite)"
	@echo "make test               install test deps if missing, lint (ruff, mypy), run the whole suite"
	@echo "make test-hypothesis    the long randomised property run (fresh seed, 20x examples; minutes)"
	@echo "make test-fast          the suite without forked ranks, subprocesses, megatron or slow commands (the inner loop)"
	@echo "make lint               ruff check + ruff format --check + mypy (type check of canzona/)"
	@echo "make slurm-up           a real single-host Slurm (2 emulated nodes; root, installs packages) [ACCOUNTING=1]"
	@echo "make test-slurm         the sweep tests against it (tests/slurm, marker slurm; minutes); make slurm-down stops it"
	@echo "make mutants            plant realistic bugs one at a time, report which the tests miss -> results/mutants/ (minutes)"
	@echo "make notebook           execute analysis/table2.ipynb headless (nbconvert) -> results/table2.ipynb"
	@echo "make planner-bench      planner quality at 256 GPUs -> results/planner/"
	@echo "make bench-step         optimizer-step benchmark, 4 gloo ranks (qwen3-tiny, -32b-w16, -tiny-widefc1, -moe-tiny EP 2) -> results/bench_step/"
	@echo "make bench-fsdp2        FSDP2 step on torchtitan's Qwen3: canzona / round-robin / all-gather vs muon-fsdp2, DistMuon; 4 gloo ranks -> results/bench_fsdp2/"
	@echo "make bench-ns           Newton–Schulz methods side by side, fp32, one thread -> results/bench_ns/"
	@echo "make soak               qwen3-micro, 4 gloo ranks, 2000 steps per engine: step time and RSS per rank -> results/soak/ (tens of minutes)"
	@echo "make megatron-peer-env  optional .venv-peer with megatron-core 0.19.x for the megatron-muon peer"
	@echo "make gpu-wheels         wheels for the GPU machine (no package index there) -> .whl/"
	@echo "make gpu-check          one GPU, <= 8 min: NS vs peers, a bf16 run's syncs and memory -> results/gpu/"

$(VPY):
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(VPY)
	$(VPY) -m pip install -q "$(TORCH_SPEC)"
	flock $(EDITABLE_LOCK) $(VPY) -m pip install -q -e ".[test,megatron,fsdp2-peers,torchtitan]"
	@# torchtitan pins torch and more (its imports' needs are the torchtitan extra); it needs Python >= 3.11
	if $(VPY) -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then \
		$(VPY) -m pip install -q --no-deps "$(TORCHTITAN_SPEC)" "$(TORCHDATA_SPEC)"; \
	else echo "Python < 3.11: no torchtitan (its example and bench model are skipped)"; fi
	@touch $(STAMP)

install: $(STAMP)

# ruff lints and checks formatting first (seconds; `ruff format .` fixes the formatting), then mypy
# type-checks canzona/ against torch's own types (config in pyproject.toml; ~2 min cold, seconds
# with its cache).
LINT = $(VPY) -m ruff check . && $(VPY) -m ruff format --check . && $(VPY) -m mypy
lint: $(STAMP)
	$(LINT)

# Lint and the suite, timed together against TEST_BUDGET_S: the last line says how long it took
# (printed, never a failure: a slow machine is not a broken commit; CI reads the line). No $(MAKE)
# in the recipe: make runs such a line even under `make -n test`, which the doc-command tests call.
test: $(STAMP)
	@t0=$$(date +%s); rc=0; \
	$(LINT) && $(VPY) -m pytest $(PYTEST_ARGS) || rc=$$?; \
	t=$$(( $$(date +%s) - t0 )); \
	echo "suite budget: make test took $$t s (lint included) of its $(TEST_BUDGET_S) s$$([ $$t -le $(TEST_BUDGET_S) ] || echo ': OVER BUDGET, see docs/CONTRIBUTING.md')"; \
	exit $$rc

# The inner loop: every test that starts no process and needs no megatron (markers in
# tests/conftest.py), no lint. `make test` stays the full suite.
test-fast: $(STAMP)
	$(VPY) -m pytest $(PYTEST_ARGS) -m "not multiproc and not megatron and not slow and not slurm"

# The long randomised property run (not part of `make test`, whose hypothesis draws are fixed): the
# `search` profile of tests/hypothesis_profiles.py, 20x the examples, a fresh seed (printed; rerun a
# failure with SEED=<it>); what it falsifies lands in tests/hypothesis-examples/ to be committed.
SEED ?= $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
test-hypothesis: $(STAMP)
	@echo "hypothesis seed $(SEED)"
	$(VPY) -m pytest $(PYTEST_ARGS) --hypothesis-profile=search --hypothesis-seed=$(SEED) $$(grep -l '@given' tests/test_*.py)

# A real Slurm on this host for the sweep tests (tools/slurm-local/: root; installs Debian's slurm
# packages when missing; ACCOUNTING=1 adds slurmdbd + MariaDB). test-slurm runs tests/slurm (marker
# slurm, left out of `make test`); SLURM_TEST_ARGS=--require-slurm fails instead of skipping (CI).
slurm-up:
	tools/slurm-local/up.sh $(if $(ACCOUNTING),--accounting)

slurm-down:
	tools/slurm-local/down.sh

# SLURM_MARK='slurm and accounting': only the tests whose verdicts read accounting (.ci/run's second mode).
SLURM_MARK ?= slurm
test-slurm: $(STAMP)
	$(VPY) -m pytest tests/slurm -m "$(SLURM_MARK)" -n 0 -q -ra --durations=0 $(SLURM_TEST_ARGS)

# The mutation check (tools/mutants.py, the list in tools/mutants.toml): every mutant in its own copy
# of the tree, its listed tests run there; minutes long, so not part of `make test`.
# MUTANTS_ARGS passes options, e.g. MUTANTS_ARGS='--only runtime -j 1' (a partial run writes nothing).
mutants: $(STAMP)
	$(VPY) tools/mutants.py $(MUTANTS_ARGS)

# Slurm when sbatch is on PATH (or CLUSTER=slurm), with PROFILE=slurm/profiles/<site>.toml,
# optionally SWEEP=slurm/sweeps/<x>.toml (default table2.toml), WAIT=1 and PLANNER=1 (the planner
# analysis after waiting); otherwise the embedded local default (CLUSTER=local forces it): a reduced
# run of a few minutes that writes every Table-2 artifact, or with FULL=1 every cell, bench run and suite.
# Without a cluster profile (the embedded default) the peer environment builds beside the main one:
# two single-threaded pip installs side by side on 2 cores. The peer's is optional: when it fails
# the run says why and goes on without the peer (experiments/reproduce_table2.py: peer_env).
reproduce-table2:
	$(if $(PROFILE),,-$(MAKE) --no-print-directory -j2 $(STAMP) $(PEER_STAMP))
	$(MAKE) --no-print-directory $(STAMP)
	$(VPY) experiments/reproduce_table2.py $(if $(CLUSTER),--cluster $(CLUSTER)) $(if $(PROFILE),--profile $(PROFILE)) $(if $(SWEEP),--sweep $(SWEEP)) $(if $(WAIT),--wait) $(if $(PLANNER),--planner) $(if $(FULL),--full)

# Collect finished sweeps (runs/<sweep>/ -> results/<sweep>.jsonl) and rebuild results/table2.*.
table2: $(STAMP)
	$(VPY) experiments/reproduce_table2.py --collect-only

# The notebook runs with its kernel in analysis/ (as Jupyter starts it); its paths resolve from the
# repository root, so it reads results/ wherever it is started.
notebook: $(STAMP)
	$(VPY) -m nbconvert --to notebook --execute analysis/table2.ipynb --output-dir results --output table2.ipynb

planner-bench: $(STAMP)
	$(VPY) -m canzona plan-bench --out results/planner

# The measured optimizer-step runs of the embedded reproduction, alone (BENCH_RUNS in
# experiments/reproduce_table2.py: qwen3-tiny, qwen3-32b-w16, qwen3-tiny-widefc1, qwen3-moe-tiny at EP 2 on
# 4 gloo ranks).
bench-step: $(STAMP)
	$(VPY) experiments/reproduce_table2.py --cluster local --full --only bench-step

# bench-step's FSDP2 sibling: torchtitan's own Qwen3 at qwen3-tiny's dimensions under torchtitan's
# fully_shard, every optimizer trained side by side on 4 gloo ranks (--model-impl local: the stand-in).
bench-fsdp2: $(STAMP)
	$(VENV)/bin/canzona bench-fsdp2 --model-impl torchtitan --nproc 4 --steps 10 --warmup 2 --out results/bench_fsdp2/qwen3-tiny_torchtitan_4gloo.json

# Gram vs standard Newton–Schulz (and the peers' kernels where importable) on long and square shapes.
# emerging-optimizers lives in the peer environment: `make bench-ns NS_PY=.venv-peer/bin/python
# NS_OUT=results/bench_ns/cpu_fp32_with_emerging.json` (after make megatron-peer-env) times it too.
NS_SHAPES ?= 512x5120,1024x5120,512x2560,1024x2048,1024x1024,512x512
NS_PY ?= $(VPY)
NS_OUT ?= results/bench_ns/cpu_fp32.json
# Long-run flatness: per-step time and each rank's RSS over 2000 steps, on each engine (a leak or a
# drift shows here; tests/test_soak.py runs a short version in the suite).
SOAK_STEPS ?= 2000
soak: $(STAMP)
	$(VPY) -m canzona.commands.soak --engine megatron --nproc 4 --steps $(SOAK_STEPS) --out results/soak/megatron_qwen3-micro_4gloo.json
	$(VPY) -m canzona.commands.soak --engine fsdp2 --nproc 4 --steps $(SOAK_STEPS) --out results/soak/fsdp2_qwen3-micro_4gloo.json

bench-ns: $(STAMP)
	$(NS_PY) -m canzona bench-ns --shapes $(NS_SHAPES) --methods standard,gram,auto,torch,emerging --dtype fp32 --threads 1 --repeats 7 --out $(NS_OUT)

clean-venv:
	rm -rf $(VENV)

# Optional peer environment for `canzona train --method megatron-muon` (Megatron's own Muon).
# megatron-core >= 0.19 and emerging-optimizers declare Python >= 3.12; on 3.11 they install with
# --ignore-requires-python --no-deps. emerging-optimizers imports typing.override (3.12): a .pth
# file aliases typing_extensions.override into typing at interpreter start-up. triton is imported
# by emerging-optimizers' kernels module even on CPU. Never a requirement of `make test`.
PEER_VENV ?= .venv-peer
PEER_MEGATRON ?= megatron-core>=0.19,<0.20
PEER_PY := $(PEER_VENV)/bin/python
PEER_STAMP := $(PEER_VENV)/.canzona-peer-installed

megatron-peer-env: $(PEER_STAMP)

$(PEER_STAMP): pyproject.toml
	$(PYTHON) -m venv $(PEER_VENV)
	$(PEER_PY) -m pip install -q --upgrade pip
	$(PEER_PY) -m pip install -q "$(TORCH_SPEC)"
	flock $(EDITABLE_LOCK) $(PEER_PY) -m pip install -q -e ".[test]" "numpy" "packaging>=24.2" "typing_extensions>=4.4" absl-py triton
	$(PEER_PY) -m pip install -q --ignore-requires-python --no-deps "$(PEER_MEGATRON)" emerging-optimizers
	echo "import typing, typing_extensions; typing.override = getattr(typing, 'override', typing_extensions.override)" \
		> "$$($(PEER_PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/canzona_typing_override.pth"
	$(PEER_PY) -c "from canzona.harness.peer_megatron import available; ok, why = available(); print(why); raise SystemExit(0 if ok else 1)"
	@touch $(PEER_STAMP)


# One GPU in <= 8 minutes (issue 10): GPU_OUT/{ns,train,cell,parity,check}.json, SUMMARY.md, gpu-check.log. The GPU machine
# has Python 3.12 and a CUDA torch but no package index and no .venv: build the wheels here with
# `make gpu-wheels` (megatron-core 0.19 is a cp312 x86-64 wheel, emerging-optimizers pure Python;
# their other needs — torch, numpy, packaging, absl-py, triton — are on that machine), carry .whl,
# and run `make gpu-check WHEELS=.whl` there (docs/gpu-check.md has the exact call). Without CUDA it
# runs the CPU flavour, which refuses results/gpu: pass GPU_OUT=<folder>. QUICK=1: smoke subset.
GPU_PYTHON ?= $(if $(wildcard $(VPY)),$(VPY),python3)
GPU_OUT ?= results/gpu
GPU_WHEELS ?= .whl
GPU_WHEEL_SPECS ?= megatron-core==0.19.2 emerging-optimizers==0.3.0
GPU_PLATFORMS := manylinux_2_28_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64

gpu-check:
	$(GPU_PYTHON) -m canzona gpu-check --out $(GPU_OUT) $(if $(WHEELS),--wheels $(WHEELS)) $(if $(QUICK),--quick)

gpu-wheels: $(STAMP)
	rm -f $(GPU_WHEELS)/*.whl
	$(VPY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		$(foreach p,$(GPU_PLATFORMS),--platform $(p)) -d $(GPU_WHEELS) $(GPU_WHEEL_SPECS)
	echo "$$(git rev-parse HEAD)$$(git diff --quiet HEAD || echo -dirty)" > $(GPU_WHEELS)/COMMIT
	@ls -l $(GPU_WHEELS)
