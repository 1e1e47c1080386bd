"""The streaming state spec: an ordered list of named tensors, described once.

The model builds it, the exporter writes it into the ONNX graph's metadata and
the bundle manifest, and every runtime backend allocates state from it. It is
torch-free so a device can read it without torch. Every tensor has the batch
(one entry per stream) on axis 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from .contract import STATE_INPUT_PREFIX, STATE_OUTPUT_PREFIX
from .errors import UserError

__all__ = ["STATE_INPUT_PREFIX", "STATE_OUTPUT_PREFIX", "StateTensorSpec", "StateSpec"]


@dataclass(frozen=True)
class StateTensorSpec:
    name: str  # where it lives, e.g. "block03.adapter1.qrnn0_h"
    shape: tuple[int, ...]  # batch first
    dtype: str = "float32"
    initial_value: float = 0.0

    @property
    def input_name(self) -> str:
        return STATE_INPUT_PREFIX + self.name

    @property
    def output_name(self) -> str:
        return STATE_OUTPUT_PREFIX + self.name

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @property
    def graph_shape(self) -> tuple[int, ...]:
        """The shape a step graph takes and gives this tensor in: streams and tokens merged into one
        stream-major axis, [B, L, ...] as [B*L, ...] (the same bytes), so the step's products read it without a
        reshape. Graphs exported before this layout take the spec's shape; a runtime binds either."""
        if len(self.shape) < 2:
            return self.shape
        return (self.shape[0] * self.shape[1],) + self.shape[2:]

    @property
    def boundary_shapes(self) -> set[tuple[int, ...]]:
        """The shapes a step graph may take and give this tensor in: ``graph_shape``, or ``shape`` in graphs
        exported before that layout; the same bytes either way, so a runtime binds either."""
        return {tuple(self.shape), tuple(self.graph_shape)}

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype,
                "initial_value": self.initial_value}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "StateTensorSpec":
        return cls(name=data["name"], shape=tuple(int(s) for s in data["shape"]),
                   dtype=data.get("dtype", "float32"), initial_value=float(data.get("initial_value", 0.0)))


@dataclass(frozen=True)
class StateSpec:
    tensors: tuple[StateTensorSpec, ...]

    def __post_init__(self) -> None:
        names = [t.name for t in self.tensors]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise UserError(f"state spec names {duplicates} more than once; each state tensor needs its own name")
        batches = {t.shape[0] for t in self.tensors}
        if len(batches) > 1:
            raise UserError(f"state tensors disagree on the batch size (axis 0): {sorted(batches)}")

    def __iter__(self) -> Iterator[StateTensorSpec]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tensors]

    @property
    def nbytes(self) -> int:
        """Bytes of state for the whole batch."""
        return sum(t.nbytes for t in self.tensors)

    def initial_numpy(self) -> list[np.ndarray]:
        """The initial state as numpy arrays, in spec order."""
        return [np.full(t.shape, t.initial_value, dtype=t.dtype) for t in self.tensors]

    def to_list(self) -> list[dict[str, Any]]:
        return [t.to_dict() for t in self.tensors]

    @classmethod
    def from_list(cls, items: Sequence[dict[str, Any]]) -> "StateSpec":
        return cls(tuple(StateTensorSpec.from_dict(d) for d in items))
