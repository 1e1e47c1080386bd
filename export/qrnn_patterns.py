"""Where a traced graph computes a QRNN adapter's pooling, found by its operators (for export/fused_ops.py).

The step form pools one frame: ``h' = h + sigmoid(f) * (QuickGELU(z) - h)`` over the halves ``[z | f]`` of one
Split of the gates (``QRNNLayer.step``). The window form computes the activations once for all its frames,
then pools them frame by frame from ``h = 0``, each frame's candidate and forget gate a Gather along the time
axis, and stacks the frames' ``h`` (Unsqueeze, Concat) (``QRNNLayer.window``). A match requires every tensor in
between to be read inside the pooling alone, so nothing else sees the tensors the fused operator does not make.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .graph_edits import attribute_value, made_by


@dataclass(frozen=True)
class Pooling:
    """A matched pooling: the Split of its gates, every node it replaces, QuickGELU's constant (in the graph's
    dtype), and for the window form's scan its time axis and frames."""

    split: object
    nodes: tuple
    alpha: np.ndarray
    h: str | None = None  # the step's previous state; None for a scan (which starts from zeros)
    axis: int | None = None
    frames: int | None = None


def _other(node, name: str) -> str | None:
    """The input of the binary ``node`` that is not ``name`` (None if ``name`` is not one of them)."""
    return node.input[1] if node.input[0] == name else node.input[0] if node.input[1] == name else None


def _activations(candidate_name: str, forget_name: str, producers: dict, constants_of) -> tuple | None:
    """(Split, (alpha*z, sigmoid, candidate, forget), z, alpha) if ``candidate_name`` is ``z * sigmoid(alpha z)``
    and ``forget_name`` is ``sigmoid(f)``, z and f the halves of one Split; else None."""
    candidate, forget = made_by(candidate_name, "Mul", producers), made_by(forget_name, "Sigmoid", producers)
    z_gate = next((n for n in (made_by(i, "Sigmoid", producers) for i in candidate.input) if n), None) \
        if candidate and forget else None
    alpha_z = made_by(z_gate.input[0], "Mul", producers) if z_gate else None
    z = _other(candidate, z_gate.output[0]) if alpha_z else None
    alpha = constants_of(_other(alpha_z, z)) if z and _other(alpha_z, z) else None
    split = producers.get(z) if alpha is not None and alpha.size == 1 else None
    if split is None or split.op_type != "Split" or list(split.output) != [z, forget.input[0]]:
        return None
    return split, (alpha_z, z_gate, candidate, forget), z, alpha


def _update(add, producers: dict, same) -> tuple | None:
    """(h, Mul, Sub, forget, candidate) if ``add`` is ``h + forget * (candidate - h)`` (``same(a, b)``: whether
    two tensors are the same h); else None."""
    if add is None or add.op_type != "Add":
        return None
    for moved_name in add.input:
        h, moved = _other(add, moved_name), made_by(moved_name, "Mul", producers)
        for forget in moved.input if moved is not None else ():
            step = made_by(_other(moved, forget), "Sub", producers)
            if step is not None and same(step.input[1], h):
                return h, moved, step, forget, step.input[0]
    return None


def _read_as_counted(counts, readers: dict) -> bool:
    return all(len(readers.get(name, [])) == n for name, n in counts)


def pooling_step(add, producers: dict, readers: dict, constants_of, shapes: dict) -> Pooling | None:
    """The step form's pooling that ``add`` ends, else None."""
    update = _update(add, producers, lambda a, b: a == b)
    activations = update and _activations(update[4], update[3], producers, constants_of)
    if not activations:
        return None
    (h, moved, step, _, _), (split, act, z, alpha) = update, activations
    counts = [(z, 2), (split.output[1], 1)] + [(n.output[0], 1) for n in (*act, step, moved)]
    state = shapes.get(h)
    if not _read_as_counted(counts, readers) or not _halves(split, state, shapes) or shapes.get(z) != state:
        return None
    return Pooling(split, (split, *act, step, moved, add), alpha, h=h)


def _halves(split, state: tuple | None, shapes: dict) -> bool:
    """Whether ``split`` cuts its input's last axis into two halves of ``state``'s shape."""
    gates = shapes.get(split.input[0])
    return (bool(gates) and bool(state) and None not in gates + state and len(gates) == len(state)
            and attribute_value(split, "axis", 0) in (-1, len(gates) - 1) and gates[:-1] == state[:-1]
            and gates[-1] == 2 * state[-1] and shapes.get(split.output[0]) == shapes.get(split.output[1]) == state)


def _frame_of(name: str, producers: dict, constants_of, axis: int, frame: int) -> tuple | None:
    """(the Gather, its source) if ``name`` is frame ``frame`` gathered along ``axis``; else None."""
    gather = made_by(name, "Gather", producers)
    index = constants_of(gather.input[1]) if gather is not None else None
    if (index is None or index.size != 1 or int(index.reshape(())) != frame
            or attribute_value(gather, "axis", 0) != axis):
        return None
    return gather, gather.input[0]


def pooling_scan(concat, producers: dict, readers: dict, constants_of, shapes: dict) -> Pooling | None:
    """The window form's pooling over its frames that ``concat`` stacks, else None."""
    out = shapes.get(concat.output[0])
    if concat.op_type != "Concat" or len(concat.input) < 2 or not out or None in out:
        return None
    axis = attribute_value(concat, "axis", 0) % len(out)
    unsqueezes = [made_by(name, "Unsqueeze", producers) for name in concat.input]
    if any(u is None or len(u.input) != 2 or constants_of(u.input[1]) is None
           or [int(a) % len(out) for a in constants_of(u.input[1]).ravel()] != [axis] for u in unsqueezes):
        return None
    hs = [u.input[0] for u in unsqueezes]

    def zeros(name: str) -> bool:
        value = constants_of(name)
        return value is not None and not value.any()

    nodes, sources, counts = [concat, *unsqueezes], set(), []
    for t, h in enumerate(hs):
        update = _update(made_by(h, "Add", producers), producers, lambda a, b: a == b or (zeros(a) and zeros(b)))
        if update is None or (update[0] != hs[t - 1] if t else not zeros(update[0])):
            return None
        _, moved, step, forget, candidate = update
        gathered = [_frame_of(name, producers, constants_of, axis, t) for name in (candidate, forget)]
        if None in gathered:
            return None
        nodes += [producers[h], moved, step, *(g for g, _ in gathered)]
        counts += [(n.output[0], 1) for n in (moved, step, *(g for g, _ in gathered))]
        sources.add(tuple(source for _, source in gathered))
    activations = _activations(*sources.pop(), producers, constants_of) if len(sources) == 1 else None
    if activations is None:
        return None
    split, act, z, alpha = activations
    frames = len(hs)
    counts += [(act[2].output[0], frames), (act[3].output[0], frames), (z, 2), (split.output[1], 1)]
    counts += [(n.output[0], 1) for n in (*act[:2], *unsqueezes)] + [(h, 3) for h in hs[:-1]] + [(hs[-1], 1)]
    pooled = out[:axis] + out[axis + 1:]  # each frame's h
    if not _read_as_counted(counts, readers) or shapes.get(z) != out or shapes.get(hs[0]) != pooled \
            or not _halves(split, out, shapes):
        return None
    return Pooling(split, (split, *act, *nodes), alpha, axis=axis, frames=frames)
