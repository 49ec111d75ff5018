"""The search stage: the searches run on the cost tables and the plan chosen and certified
(`candidates`), the hand-written baselines (`baselines`), the memory budget (`memory_budget`) and
the user's planning options (`options`). Pure.
"""
