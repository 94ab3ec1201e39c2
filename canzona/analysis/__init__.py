"""Analysis: results JSON lines -> validated tables, Table 2, plots, projection, paper-claims report.

The last layer of Canzona: it reads what the harness and the benchmarks wrote
(``canzona.results.schema``), never the other way round, and it is the only place that turns
timings into speedups, so every number in ``results/table2.md`` has one derivation.

  load        read + validate result lines into a pandas DataFrame (one row per run)
  plans       a line's plan section as row columns (which α, layout, groups, profile; its hash)
  aggregate   repetitions of a cell -> median, p90, n; speedups vs each baseline
  table2      the Table-2 frame and its CSV / Markdown files
  projection  analytic step / iteration time per method from the planner's plans + a hardware profile
  report      each paper claim beside our value, with provenance and a verdict
  plots       PNG figures (speedups, phases, per-GPU load, alpha trade-off)
"""

from canzona.analysis.aggregate import aggregate_cells, speedups
from canzona.analysis.load import load_results, records_frame

__all__ = ["aggregate_cells", "load_results", "records_frame", "speedups"]
