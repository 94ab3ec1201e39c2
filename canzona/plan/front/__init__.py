"""The planner's front: ``canzona plan`` and ``canzona plan-bench`` (``cli``, ``bench*``), text
reports and plots. These write results files, so they come after ``canzona.results`` in the layer
order; nothing in the planner's library imports them.
"""
