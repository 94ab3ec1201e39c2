"""DP partitioners: which DP rank owns each matrix and where every bucket is cut.

``problem`` holds the flat view they share (``DPProblem``) and turns an owner assignment into a
DPPlan; ``baselines``, ``canzona``, ``padded``, ``refine`` and ``coop`` are the partitioners, which
``canzona.plan.strategies`` registers.
"""
