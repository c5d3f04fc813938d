"""The speed benchmarks (benchmarks/speed/): ``python benchmarks/run_speed.py [NAME ...] --threads 2 [--quick]``.

The same as ``rlattention bench``: every benchmark, or the named ones (sensor, ram_throughput, anchor_crop,
rarl_inference, sketch_ranks, retrieval, reid, training), writes ``<out>/<name>.json`` and ``<out>/<name>.md``
(``--out``, default ``benchmarks/results``); several write ``<out>/summary.md`` too.
"""

import sys

from speed import main

if __name__ == "__main__":
    sys.exit(main(prog="benchmarks/run_speed.py"))
