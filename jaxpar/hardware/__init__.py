"""The hardware a plan targets, as pure data and formulas (numpy only, no jax import).

- `devices`: `DeviceSpec`, `LinkLevel`, `DeviceGroup` and the units `GB`, `TFLOPS`, `US`;
- `datasheets`: the presets' numbers, each with its source (GPU systems, TPU slices, AccPar);
- `presets`: sizing them into clusters (`Cluster.preset`) and detecting one (`Cluster.detect`,
  from `DeviceInfo` descriptions);
- `cluster`: `Cluster`, the topology model: levels, groups, links and bandwidths per mesh axis;
- `mesh_model`: the cost model's view of a mesh on a cluster (`MeshAxes`, `mesh_axes`, ...);
- `speeds`: heterogeneous per-device speeds, AccPar's ratio split (`MeshSpeeds`);
- `calibration`: numbers measured on the devices (`Calibration`, written by `jaxpar calibrate`):
  throughput curves, memory bandwidth, per-axis collective fits, and their JSON file.

The jax side (building meshes, describing them, picking the cluster for one) is
`jaxpar.meshes`.
"""

from .cluster import Cluster
from .devices import GB, TFLOPS, US, DeviceGroup, DeviceSpec, LinkLevel
from .mesh_model import MeshAxes, device_positions, mesh_axes, mesh_speeds, slowest_device
from .presets import DeviceInfo, preset_sizing
from .speeds import MeshSpeeds, ratio_factor

__all__ = [
    "GB",
    "TFLOPS",
    "US",
    "Cluster",
    "DeviceGroup",
    "DeviceInfo",
    "DeviceSpec",
    "LinkLevel",
    "MeshAxes",
    "MeshSpeeds",
    "device_positions",
    "mesh_axes",
    "mesh_speeds",
    "preset_sizing",
    "ratio_factor",
    "slowest_device",
]
