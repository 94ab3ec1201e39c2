"""Readers of plans and their lowered schedule: per-GPU loads and THE metrics function (``metrics``,
``bucket_metrics``), bytes per GPU (``memory``) and the communication budget (``budget``). They
decide nothing a plan could say.
"""
