"""Thin torchrun entry for one harness run (same flags as `canzona train`).

    torchrun --nproc-per-node 4 experiments/train.py --model qwen3-tiny --tp 2 --dp 2 \
        --method canzona --optimizer muon --seq-len 128 --micro-batch 1 --global-batch 4 \
        --warmup 2 --iters 8 --alpha 1.0 --bucket-size 40000000 --results results/train.jsonl

Under torchrun each process is one rank (gloo on CPU, NCCL on GPU); run directly without
torchrun it forks the ranks itself (--nproc, default tp·pp·dp).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from canzona.commands.train import main

if __name__ == "__main__":
    raise SystemExit(main())
