"""Memory per device under a plan: where each tensor is made and read (`buffer_reads`), the
liveness walk (`model`), shard_map bodies' own buffers, the bytes each node holds for long
(`held_bytes`), and the estimate and budget vocabulary (`estimate`). Pure.
"""
