"""Speed benchmarks, one module each: ``rlattention bench [sensor|ram_throughput|...|training] --threads 2 [--quick]``
(or ``python benchmarks/run_speed.py ...``, the same arguments).

``common`` (timing, machine record, tables, quiet engine runs) and one module per benchmark: ``sensor``,
``ram_throughput``, ``anchor_crop``, ``rarl_inference``, ``sketch_ranks``, ``retrieval``, ``reid``, ``training``; each
has ``bench_<name>`` (the measurement, a result dict), ``<name>_markdown`` (its table) and ``summary_rows`` (its rows
of ``summary.md``). ``runner`` names them (:data:`BENCHMARKS`) and runs them (:func:`run_benchmarks`). This package
lies outside ``rlattention``: the library never imports it; ``rlattention bench`` does, from a source checkout.

When more than one benchmark runs, ``<out>/summary.md`` holds one table of every comparison (:func:`summary_rows`
per benchmark, from the stored results), the machine and the command.
"""

from .runner import BENCHMARKS, SUMMARY_ROWS, main, run_benchmarks, summary_markdown, summary_rows
from .training import TRAINING_CASES, bench_training

__all__ = [
    "BENCHMARKS",
    "SUMMARY_ROWS",
    "TRAINING_CASES",
    "bench_training",
    "main",
    "run_benchmarks",
    "summary_markdown",
    "summary_rows",
]
