"""Running a plan: `auto_shard` and the applier, multi-process execution, and measuring the
devices at hand (`calibrate`, `measure_contractions`).
"""
