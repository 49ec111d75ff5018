"""The pipeline driver (`pipeline`, the only one) from a train step to a `Plan` (`plan`), and
what a plan becomes: reports, figures, plan files, exported specs, reuse of a saved plan.
"""
