"""Pricing: each node's compute and own collectives under a configuration (`node_costs`,
`kernels`), reshard prices (`reshard_tables`), the two search problems' cost tables
(`search_tables`), the reported evaluation of an assignment (`evaluation`) and the step on two
streams (`step_timeline`, `overlap`). Pure.
"""
