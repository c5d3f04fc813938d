#!/usr/bin/env bash
# Run every benchmark on 2 torch threads; tables go to benchmarks/results/<name>.{json,md} and one table of all
# ratios to benchmarks/results/summary.md. Extra arguments are passed on (e.g. --quick, or benchmark names:
# sensor, ram_throughput, anchor_crop, rarl_inference, sketch_ranks, retrieval, reid, training).
set -euo pipefail
cd "$(dirname "$0")/.."
rlattention bench --threads 2 --out benchmarks/results "$@"
