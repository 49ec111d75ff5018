"""The bytes each node holds for long: the memory budget's linear proxy (docs/memory.md,
"Memory budget").

The exact peak (`memory.MemoryModel`) is a liveness walk, not a sum over nodes. The budget's
Lagrangian solves need a per-node price, linear in the node configurations: what a node holds
for long under each of its configurations (its argument's shard, its buffers read in a later
phase or through a loop), plus any tensors the budget search adds (those live at the peaks it
saw). The report's per-layer "held" column is the same figure.

Pure: numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..nodes.configs import dim_degrees
from ..program.graph import SCAN_SLICE
from .model import MemoryModel


class HeldBytes:
    """Per node and configuration, the bytes it holds for long (cached per node)."""

    def __init__(self, model: MemoryModel):
        self.inp, self.long_lived = model.inp, model.long_lived
        self.no_device_buffer = model.no_device_buffer
        self._node_bytes: dict[int, np.ndarray] = {}
        self._degrees: dict[int, np.ndarray] = {}

    def per_node(self, assignment: Sequence[int]) -> list[float]:
        """Per node, `node_bytes` of its configuration in ``assignment``."""
        return [float(self.node_bytes(v)[a]) for v, a in enumerate(assignment)]

    def node_bytes(self, node: int, extra: frozenset[int] = frozenset()) -> np.ndarray:
        """The Lagrangian proxy, per configuration of ``node``: the bytes it holds for long.

        An input node: its argument's shard (not the batch: every plan splits it alike). Any
        other node: its buffers read in a later phase (activations saved for the backward pass,
        gradients read by the update) or inside a loop from outside it, each over the shard
        count of its layout, and its tensors in ``extra`` (the budget search adds the buffers
        live at the peaks it has seen: `MemoryModel.estimate_with_peak`). A scan's slice node
        also holds the stacked xs in the layout it reads them: resharded before the loop (a
        whole stack gathered at once, FSDP undone), that copy lives through every iteration.
        """
        if node not in self._node_bytes:
            self._node_bytes[node] = self._base_bytes(node)
        out = self._node_bytes[node]
        more = [t for t in self.inp.ng.nodes[node].tensor_maps if t in extra]
        for t in more:
            if not self._counted(node, t):
                out = out + self.tensor_bytes(node, t)
        return out

    def _counted(self, node: int, t: int) -> bool:
        """Whether ``t`` (a tensor of ``node``) is in its base proxy."""
        if self.inp.ng.nodes[node].anchor < 0:
            return self.inp.arg_kinds.get(t, "other") != "batch"
        return t in self.long_lived

    def tensor_bytes(self, node: int, t: int) -> np.ndarray:
        """Per configuration of ``node``, the per-device bytes of its tensor ``t``."""
        inp = self.inp
        nd = inp.ng.nodes[node]
        mp = nd.tensor_maps.get(t)
        tensor = inp.ng.program.tensors[t]
        if not tensor.nbytes or mp is None or self.no_device_buffer(t):
            return np.zeros(len(inp.configs[node]))
        return tensor.nbytes / self._shards(node, mp)

    def _shards(self, node: int, mp) -> np.ndarray:
        """Per configuration of ``node``, the shard count of a tensor mapped by ``mp``."""
        cfgs = self.inp.configs[node]
        if node not in self._degrees:
            space = self.inp.ng.nodes[node].space
            self._degrees[node] = dim_degrees(cfgs, len(space.sizes), self.inp.sizes)
        D = self._degrees[node]
        shards = np.ones(len(cfgs))
        for m in mp:
            if m is not None:
                shards = shards * D[:, m]
        return shards

    def _base_bytes(self, node: int) -> np.ndarray:
        inp = self.inp
        nd = inp.ng.nodes[node]
        out = np.zeros(len(inp.configs[node]))
        for t in nd.tensor_maps:
            if self._counted(node, t):
                out += self.tensor_bytes(node, t)
        if nd.anchor >= 0 and inp.ng.program.eqns[nd.anchor].primitive == SCAN_SLICE:
            stacked = inp.ng.program.eqns[nd.anchor].inputs[0]
            mp = nd.members[0].in_maps[0]
            if stacked is not None and mp is not None:
                out += inp.ng.program.tensors[stacked].nbytes / self._shards(node, mp)
        return out
