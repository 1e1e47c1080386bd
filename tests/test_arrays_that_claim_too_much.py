"""A NumPy file's header says its array's shape, and numpy allocates that shape before it reads a byte. A state
snapshot (--resume), a score trace or a bundle's query embeddings of 200 bytes whose header claims [10^6, 10^6]
floats went to the last net as "out of memory ... ask for less: fewer streams (--batch), fewer frames, or a smaller
model", advice about the model for a damaged file. Each is refused as the file it is, naming it."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from test_bundle_queries import resealed

from sdqes_edge.errors import UserError
from sdqes_edge.files import file_sha256
from sdqes_edge.runtime.bundle import BundleError, load_bundle
from sdqes_edge.runtime.snapshots import STATE_PREFIX, UnusableSnapshot, read_snapshot
from sdqes_edge.traces import load_scores

CLAIMS_TOO_MUCH = r"an array in it claims more memory than this machine has: Unable to allocate 3.64 TiB"


def claiming(shape: tuple[int, ...] = (10**6, 10**6)) -> bytes:
    """A .npy whose header claims ``shape`` float32s, followed by 64 bytes of them."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return header.getvalue() + bytes(64)


def npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def archive(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(f"{name}.npy", data)
    return path


def test_a_snapshot_whose_state_claims_terabytes_is_refused_as_no_snapshot(tmp_path):
    snapshot = archive(tmp_path / "state.npz", {f"{STATE_PREFIX}block00.adapter1.qrnn0_h": claiming(),
                                                "frame_counts": npy(np.array([3]))})
    with pytest.raises(UnusableSnapshot, match=f"state.npz is not a state snapshot written by save_state "
                                               f"[(]{CLAIMS_TOO_MUCH}"):
        read_snapshot(snapshot)


def test_a_score_trace_whose_scores_claim_terabytes_is_refused_as_no_trace(tmp_path):
    trace = archive(tmp_path / "vid.npz", {"format_version": npy(np.array(1)), "stream": npy(np.array("vid")),
                                           "fps": npy(np.array(1.0)), "query_texts": npy(np.array(["q"])),
                                           "query_ids": npy(np.array(["0"])), "asked_time": npy(np.zeros(1)),
                                           "probs": claiming()})
    with pytest.raises(UserError, match=f"vid.npz is not a score trace written by `sdqes-edge run --scores` "
                                        f"[(]{CLAIMS_TOO_MUCH}"):
        load_scores(trace)


def test_bundle_query_embeddings_that_claim_terabytes_are_refused_naming_them(tmp_path):
    bundle = resealed(tmp_path)  # a bundle with pre-encoded queries
    (bundle / "query_embeddings.npy").write_bytes(claiming())
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["files"]["query_embeddings.npy"] = {"sha256": file_sha256(bundle / "query_embeddings.npy"),
                                                 "bytes": (bundle / "query_embeddings.npy").stat().st_size}
    (bundle / "manifest.json").write_text(json.dumps(manifest))  # as its maker would have listed it
    with pytest.raises(BundleError, match=f"pre-encoded queries of {bundle} are unusable [(]{CLAIMS_TOO_MUCH}"):
        load_bundle(bundle)
