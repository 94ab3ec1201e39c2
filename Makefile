# Canzona: the two entry points of a fresh machine are `make reproduce-table2` and `make test`.
# Both create .venv on first use. torch==2.13.0 is installed FIRST (a local CPU build on our
# machines) so that no later dependency can resolve a CUDA torch; on a GPU cluster set
# TORCH_SPEC to the torch you want (e.g. TORCH_SPEC='torch>=2.4').
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.canzona-installed
PYTEST_ARGS ?= -n 2 -q

.PHONY: help install test reproduce-table2 table2 planner-bench bench-step clean-venv

help:
	@echo "make reproduce-table2   run the Table-2 reproduction (Slurm if present, else the embedded local default)"
	@echo "make test               install test deps if missing, run the test suite"
	@echo "make planner-bench      planner quality at 256 GPUs -> results/planner/"
	@echo "make bench-step         optimizer-step benchmark, 4 gloo ranks -> results/bench_step/"

$(VPY):
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(VPY)
	$(VPY) -m pip install -q "$(TORCH_SPEC)"
	$(VPY) -m pip install -q -e ".[test,megatron]"
	@touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(VPY) -m pytest $(PYTEST_ARGS)

reproduce-table2: $(STAMP)
	$(VPY) experiments/reproduce_table2.py

planner-bench: $(STAMP)
	$(VPY) -m canzona plan-bench --out results/planner

bench-step: $(STAMP)
	$(VPY) -m canzona bench-step --nproc 4 --dp 2 --tp 2 --model qwen3-tiny --optimizer muon --steps 20 --json --out results/bench_step/muon_dp2_tp2.json

clean-venv:
	rm -rf $(VENV)
