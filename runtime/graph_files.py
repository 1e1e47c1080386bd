"""The files an ONNX graph makes its reader open besides itself (the locations of its external data), and the
metadata it carries (``metadata_props``, where a step graph keeps its description).

A tensor of an ONNX graph may keep its bytes in another file (``external_data`` "location"), which ONNX
Runtime and TensorRT's parser open relative to the graph. In someone else's bundle that location could be
``../../home/user/.ssh/id_rsa`` or a symlink leading out; ONNX Runtime refuses such paths only since 1.24,
TensorRT's parser not everywhere, and this runtime supports ONNX Runtime 1.17 and newer. So the bundle
loader (``bundle.load_bundle``) reads every location a graph names, and refuses any that is not a file of
the bundle listed with its sha256, before any library opens the graph.

Read from the protobuf wire format directly, because the runtime does not install the ``onnx`` package: only
the messages that can hold a tensor are entered, and every other field is skipped by its length, so the
weights themselves (``raw_data``) are never read. ``TENSOR_HOLDERS`` is checked against onnx's own schema
by the tests.
"""

from __future__ import annotations

import mmap
from pathlib import Path

# message -> {field number: message it holds}, for every field through which a TensorProto can be reached
# (onnx.proto; tests/test_bundle_confinement.py derives the same table from onnx's descriptors).
TENSOR_HOLDERS: dict[str, dict[int, str]] = {
    "ModelProto": {7: "GraphProto", 20: "TrainingInfoProto", 25: "FunctionProto"},
    "TrainingInfoProto": {1: "GraphProto", 2: "GraphProto"},
    "GraphProto": {1: "NodeProto", 5: "TensorProto", 15: "SparseTensorProto"},
    "FunctionProto": {7: "NodeProto", 11: "AttributeProto"},
    "NodeProto": {5: "AttributeProto"},
    "AttributeProto": {5: "TensorProto", 6: "GraphProto", 10: "TensorProto", 11: "GraphProto",
                       22: "SparseTensorProto", 23: "SparseTensorProto"},
    "SparseTensorProto": {1: "TensorProto", 2: "TensorProto"},
}
# How deep messages may nest, protobuf's own default (and so ONNX Runtime's): a graph whose subgraphs nest deeper is
# not one any library reads. The walk is recursive, and 3,000 nested subgraphs in 30 KB were a RecursionError.
NESTING_LIMIT = 100
MODEL_METADATA_PROPS = 14  # ModelProto.metadata_props: repeated StringStringEntryProto {key = 1, value = 2}
TENSOR_EXTERNAL_DATA = 13  # TensorProto.external_data: repeated StringStringEntryProto {key = 1, value = 2}
EXTERNAL_LOCATION_KEY = "location"

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


class NotAGraph(ValueError):
    """The bytes are not a protobuf message (a damaged or foreign file)."""


def external_data_locations(path: str | Path) -> list[str]:
    """Every external-data location the graph at ``path`` names, in file order (repeats kept out)."""
    found: list[str] = []
    _read(path, lambda view: _walk(view, 0, len(view), "ModelProto", found, 1))
    return list(dict.fromkeys(found))


def metadata_props(path: str | Path) -> dict[str, str]:
    """The graph's ``metadata_props`` (key -> value), read without entering the graph itself."""
    props: dict[str, str] = {}

    def read(view: memoryview) -> None:
        for number, start, stop in _fields(view, 0, len(view)):
            if number == MODEL_METADATA_PROPS:
                entry = {field: bytes(view[a:b]).decode("utf-8", "replace")
                         for field, a, b in _fields(view, start, stop)}  # {1: key, 2: value}
                props[entry.get(1, "")] = entry.get(2, "")
    _read(path, read)
    return props


def _read(path: str | Path, visit) -> None:
    """``visit(memoryview)`` over the file's bytes, mapped (an empty file: not visited)."""
    with open(path, "rb") as fh:
        if fh.seek(0, 2) == 0:
            return
        problem = None
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            view = memoryview(data)
            try:
                visit(view)
            except NotAGraph as exc:  # raised again below: its traceback would keep the map open
                problem = str(exc)
            finally:
                view.release()
    if problem:
        raise NotAGraph(problem)


def _varint(data: memoryview, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise NotAGraph("a varint runs past its message")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(data: memoryview, pos: int, end: int):
    """(field number, start, end) of each length-delimited field of the message in ``data[pos:end]``; other
    fields are stepped over."""
    while pos < end:
        key, pos = _varint(data, pos, end)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            _, pos = _varint(data, pos, end)
        elif wire in (_FIXED64, _FIXED32):
            pos += 8 if wire == _FIXED64 else 4
        elif wire == _LENGTH:
            size, pos = _varint(data, pos, end)
            if pos + size > end:
                raise NotAGraph("a field runs past its message")
            yield number, pos, pos + size
            pos += size
        else:  # groups (3, 4) are not used by ONNX; anything else is not protobuf
            raise NotAGraph(f"wire type {wire} of field {number}")
        if pos > end:
            raise NotAGraph("a field runs past its message")


def _walk(data: memoryview, pos: int, end: int, message: str, found: list[str], depth: int) -> None:
    if depth > NESTING_LIMIT:
        raise NotAGraph(f"messages nested deeper than protobuf's limit of {NESTING_LIMIT}")
    if message == "TensorProto":
        for number, start, stop in _fields(data, pos, end):
            if number == TENSOR_EXTERNAL_DATA:
                entry = {field: bytes(data[a:b]).decode("utf-8", "replace")
                         for field, a, b in _fields(data, start, stop)}  # {1: key, 2: value}
                if entry.get(1) == EXTERNAL_LOCATION_KEY:
                    found.append(entry.get(2, ""))
        return
    holders = TENSOR_HOLDERS[message]
    for number, start, stop in _fields(data, pos, end):
        if number in holders:
            _walk(data, start, stop, holders[number], found, depth + 1)
