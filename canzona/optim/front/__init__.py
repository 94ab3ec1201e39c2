"""The optimizers' front: ``canzona bench-ns`` (``bench_ns``), which writes a results file, so it
comes after ``canzona.results`` in the layer order.
"""
