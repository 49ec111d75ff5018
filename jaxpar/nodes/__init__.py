"""Planning nodes (equations merged with their elementwise followers), their configurations
(which iteration dim each mesh axis splits), their layer labels and batch dims, and repeated
blocks that share one configuration. Pure.
"""
