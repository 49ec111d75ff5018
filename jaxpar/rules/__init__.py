"""The rule of each primitive: its iteration space (einsum-like maps of every operand's and
result's dims), keyed by primitive in `opspace.RULES`; families in their own modules
(contractions, indexing, linalg, loops, shard_map). Pure.
"""
