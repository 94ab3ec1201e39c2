"""Readers of plans and their lowered schedule: per-GPU loads and THE metrics function (``metrics``,
``bucket_metrics``), bytes per GPU (``memory``), the communication budget (``budget``) and what a
results line records of a plan (``summary``). They decide nothing a plan could say.
"""
