"""What a plan's memory comes to per device, and the budget it is held to: `MemoryEstimate`
(the parts and the peak that `memory.MemoryModel` predicts), `MemoryBudgetError`, the margin
kept for the model's error, and byte sizes for people (`parse_bytes`, `gb`).

Pure: no jax.
"""

from __future__ import annotations

import dataclasses
import re

ARG_KINDS = ("params", "optimizer", "batch", "other")
RESERVE_FRACTION = 0.1  # default budget: device memory less this (runtime, fragmentation)
# A plan fits a budget when its predicted peak is within (1 - margin) of it: the margin is kept
# for the model's own error. On XLA:CPU it is measured (tests/test_memory.py,
# bench/memory/memory_fullwidth.py): compiled/predicted peak up to 1.19 on the small GPT's
# memory-constrained plans (1.34 when the margin was set), 1.10 at llama3_70b's width (0.92 with
# remat), at most 1.083 on the small zoo's 90 test plans, so CPU_MODEL_MARGIN keeps
# 1 - 1/1.35 of the budget. On GPU/TPU the model's error is not measured; MODEL_MARGIN is
# a guard of 10 %. See docs/memory.md, "Memory".
MODEL_MARGIN = 0.1
CPU_MODEL_MARGIN = 0.26


class MemoryBudgetError(ValueError):
    """No plan the planner can reach fits the memory budget (or the budget is impossible)."""


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Predicted bytes per device of one train step under a plan."""

    params: float  # parameter arguments
    optimizer: float  # optimizer-state arguments
    batch: float  # batch arguments
    other_args: float  # any other argument
    outputs: float  # results not aliased to a donated argument
    activations: float  # forward buffers live at the peak (saved for the backward pass)
    gradients: float  # backward buffers live at the peak
    temporaries: float  # other buffers live at the peak
    peak: float  # arguments + outputs + live buffers at the peak
    peak_phase: str  # phase of the equation at the peak
    peak_layer: str  # its layer
    budget: float | None = None
    margin: float = MODEL_MARGIN  # of the budget, kept for the model's error (CPU_MODEL_MARGIN)

    @property
    def arguments(self) -> float:
        return self.params + self.optimizer + self.batch + self.other_args

    @property
    def state(self) -> float:
        """Parameters and optimizer state: what FSDP / ZeRO shards."""
        return self.params + self.optimizer

    @property
    def limit(self) -> float | None:
        """The largest predicted peak that fits the budget: the budget less ``margin``."""
        return None if self.budget is None else self.budget * (1 - self.margin)

    @property
    def fits(self) -> bool | None:
        return None if self.limit is None else self.peak <= self.limit

    def as_dict(self) -> dict[str, float | str | bool | None]:
        out = dataclasses.asdict(self)
        out["fits"] = self.fits
        out["limit"] = self.limit
        return out

    def breakdown(self) -> str:
        """One line per part, in GB."""
        parts = [
            ("params", self.params), ("optimizer state", self.optimizer), ("batch", self.batch),
            ("other arguments", self.other_args), ("outputs", self.outputs),
            ("activations", self.activations), ("gradients", self.gradients),
            ("temporaries", self.temporaries),
        ]  # fmt: skip
        lines = [f"  {name:<16} {gb(v):>10}" for name, v in parts if v]
        where = ", ".join(x for x in (self.peak_phase, self.peak_layer) if x)
        lines.append(f"  {'peak':<16} {gb(self.peak):>10}  (at {where or 'the start'})")
        if self.budget is not None:
            verdict = "fits" if self.fits else "DOES NOT FIT"
            lines.append(
                f"  {'budget':<16} {gb(self.budget):>10}  {verdict} (a plan's peak must be at "
                f"most {gb(self.limit)}: {self.margin:.0%} kept for the model's error)"
            )
        return "\n".join(lines)


def gb(nbytes: float) -> str:
    """Bytes for people: GB from 1 GB up, else MB."""
    if abs(nbytes) >= 1e9:
        return f"{nbytes / 1e9:.2f} GB"
    return f"{nbytes / 1e6:.2f} MB"


def parse_bytes(value: float | int | str) -> float:
    """``60e9``, ``"60GB"``, ``"80 GiB"``, ``"512MB"`` -> bytes."""
    if isinstance(value, bool):
        raise TypeError(f"memory budget must be bytes or a string like '60GB', not {value!r}")
    if isinstance(value, (int, float)):
        if not value > 0:
            raise ValueError(f"memory budget must be positive, got {value!r}")
        return float(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([KMGT]i?B|B)?\s*", str(value), re.I)
    if not m:
        raise ValueError(f"memory budget {value!r}: give bytes or a size like '60GB' or '80GiB'")
    units = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}
    units |= {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
    out = float(m.group(1)) * units[(m.group(2) or "B").upper()]
    if not out > 0:
        raise ValueError(f"memory budget must be positive, got {value!r}")
    return out


def arg_kind(path: str, is_batch: bool) -> str:
    """Classify an argument by its pytree path: optimizer state, parameters, batch, other."""
    if is_batch:
        return "batch"
    if "opt_state" in path or re.search(r"\b(mu|nu|momentum|trace)\b", path):
        return "optimizer"
    if "param" in path or "kernel" in path or "embedding" in path or "scale" in path:
        return "params"
    return "other"
