"""Matrix executors behind one interface: ``base`` (the step context and ``MatrixExecutor``), ``tp``
(local, TP all-gather, TP micro-group pipeline, and ``select_executors``) and ``coop`` (cooperative
Newton–Schulz groups).
"""
