"""Collective kinds and their α-β prices (ring accounting), written once for the whole package.

Bytes are *bytes sent per device* under the ring algorithm (docs/cost.md, "Cost formulas"):
the cost model prices with these functions and `verify` reads the compiled program's
collectives with the same ones, so a prediction and a measurement are in the same unit.

Pure: no jax import.
"""

from __future__ import annotations

ALL_REDUCE = "all-reduce"
ALL_GATHER = "all-gather"
REDUCE_SCATTER = "reduce-scatter"
ALL_TO_ALL = "all-to-all"
PERMUTE = "collective-permute"
KINDS = (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, PERMUTE)


def all_reduce_bytes(buffer_bytes: float, n: int) -> float:
    """Bytes sent per device by a ring all-reduce of an S-byte buffer: 2(n-1)/n · S."""
    return 2.0 * (n - 1) / n * buffer_bytes if n > 1 else 0.0


def all_reduce_buffer(sent_bytes: float, n: int) -> float:
    """The buffer S of a ring all-reduce that sends ``sent_bytes`` per device: the inverse of
    `all_reduce_bytes`, S = sent · n / (2(n-1)) (n > 1)."""
    return sent_bytes * n / (2 * (n - 1))


def all_gather_bytes(out_bytes: float, n: int) -> float:
    """Bytes sent per device by a ring all-gather producing S_out bytes: (n-1)/n · S_out."""
    return (n - 1) / n * out_bytes if n > 1 else 0.0


def reduce_scatter_bytes(in_bytes: float, n: int) -> float:
    """Bytes sent per device by a ring reduce-scatter of an S_in-byte input: (n-1)/n · S_in."""
    return (n - 1) / n * in_bytes if n > 1 else 0.0


def all_to_all_bytes(buffer_bytes: float, n: int) -> float:
    """Bytes sent per device by an all-to-all of an S-byte buffer: (n-1)/n · S."""
    return (n - 1) / n * buffer_bytes if n > 1 else 0.0


def result_bytes_sent(kind: str, n: int, result_bytes: float) -> float:
    """Bytes sent per device by a collective whose per-device *result* is ``result_bytes``.

    What a compiled program shows is the result shape: all-reduce 2(n-1)/n · S; all-gather and
    all-to-all (n-1)/n · S; reduce-scatter (n-1) · S (its input is n · S); collective-permute
    S (the caller scales by the fraction of devices that move data).
    """
    if n <= 1:
        return 0.0
    if kind == ALL_REDUCE:
        return all_reduce_bytes(result_bytes, n)
    if kind == ALL_GATHER:
        return all_gather_bytes(result_bytes, n)
    if kind == ALL_TO_ALL:
        return all_to_all_bytes(result_bytes, n)
    if kind == REDUCE_SCATTER:
        return reduce_scatter_bytes(n * result_bytes, n)
    if kind == PERMUTE:
        return float(result_bytes)
    raise ValueError(f"unknown collective kind {kind!r}; expected one of {KINDS}")


def ring_steps(kind: str, n: int) -> int:
    """Message steps of the ring algorithm (the latency term): 2(n-1) for all-reduce, 1 for a
    permute, n-1 otherwise."""
    if n <= 1:
        return 0
    return 2 * (n - 1) if kind == ALL_REDUCE else (1 if kind == PERMUTE else n - 1)


def transfer_time(kind: str, nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """α-β time of one collective: latency · ring_steps + bytes / bandwidth."""
    if nbytes <= 0:
        return 0.0
    return latency * ring_steps(kind, n) + nbytes / bandwidth
