"""Checking a plan against the compiled program: the collectives XLA emitted, read out of the
optimized HLO text (`compiled`, `hlo_text`), and its memory. Pure: no jax import; `jaxpar.verify`
is public."""

from .compiled import (
    Fidelity,
    HloCollective,
    collective_summary,
    compiled_collectives,
    compiled_memory,
    compiled_peak_bytes,
    fidelity,
    module_device_count,
    parse_collectives,
    predicted_counts,
    replica_group_size,
    ring_bytes_per_device,
)

__all__ = [
    "Fidelity",
    "HloCollective",
    "collective_summary",
    "compiled_collectives",
    "compiled_memory",
    "compiled_peak_bytes",
    "fidelity",
    "module_device_count",
    "parse_collectives",
    "predicted_counts",
    "replica_group_size",
    "ring_bytes_per_device",
]
