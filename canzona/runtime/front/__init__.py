"""The runtime's front: ``canzona bench-step`` (``bench``), which forks gloo ranks and writes a
results file, so it comes after ``canzona.results`` in the layer order.
"""
