"""A program that scores many streams loads a bundle's graphs once and hands them to each detector
(``backend_instance``, ``text_encoder``). Parts loaded from another bundle are refused in one line: another export
of the same shapes ran the other model's weights silently, and other shapes failed deep inside ONNX Runtime.
A copy of the same bundle is the same model, and is accepted. What makes the parts (``make_backend``,
``text_encoder_for``, which the refusals name) is public, in ``sdqes_edge.runtime``.
"""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
from conftest import random_model

from sdqes_edge.errors import UserError
from sdqes_edge.export import ExportOptions, export_bundle
from sdqes_edge.runtime import Frame, StreamingDetector, load_bundle, make_backend, text_encoder_for

QUERY = "When I start to cut the onion, remind me to turn on the fan."


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """Two exports of one tiny architecture with other weights, and the first again for two streams."""
    root = tmp_path_factory.mktemp("parts")
    made = {}
    for name, seed, batch in (("ours", 0, 1), ("other", 1, 1), ("ours_batch2", 0, 2)):
        export_bundle(random_model("qrnn", seed=seed), root / name, ExportOptions(batch=batch, show_progress=False),
                      log=lambda m: None)
        made[name] = load_bundle(root / name)
    return made


def refusal(bundle, **parts) -> str:
    with pytest.raises(UserError) as refused:
        StreamingDetector(bundle, **parts)
    assert "\n" not in str(refused.value)
    return str(refused.value)


def test_a_step_graph_of_another_export_with_the_same_shapes_is_refused(bundles):
    words = refusal(bundles["ours"], backend_instance=make_backend(bundles["other"]))
    assert "none of this bundle's step graphs" in words and "make_backend(bundle" in words


def test_a_text_encoder_of_another_export_is_refused(bundles):
    words = refusal(bundles["ours"], text_encoder=text_encoder_for(bundles["other"]))
    assert "not this bundle's text graph" in words and "text_encoder_for(bundle)" in words


def test_a_step_graph_for_another_batch_is_refused_before_onnx_runtime_sees_a_frame(bundles):
    words = refusal(bundles["ours_batch2"], backend_instance=make_backend(bundles["ours"]))
    assert "another state than this bundle's" in words


def test_parts_loaded_from_a_copy_of_the_same_bundle_are_the_same_model(bundles, tmp_path):
    copy = load_bundle(shutil.copytree(bundles["ours"].root, tmp_path / "copy"))
    shared = StreamingDetector(bundles["ours"], backend_instance=make_backend(copy),
                               text_encoder=text_encoder_for(copy))
    own = StreamingDetector(bundles["ours"])
    frame = Frame(image=np.full((40, 48, 3), 90, np.uint8), time=0.0, index=0)
    for detector in (shared, own):
        detector.add_query(QUERY)
        detector.step([frame])
    np.testing.assert_array_equal(shared.last_embeddings, own.last_embeddings)
    np.testing.assert_array_equal(shared.queries.matrix, own.queries.matrix)


def test_options_that_choose_a_part_the_detector_was_given_are_named_as_ignored(bundles):
    """precision="fp16" beside a backend made for fp32 ran fp32 without a word; only the options that choose the
    part given are named, each once, at the program's line."""
    import warnings

    from sdqes_edge.errors import SetupWarning

    ours = bundles["ours"]
    with pytest.warns(SetupWarning) as caught:
        StreamingDetector(ours, precision="fp16", threads=2, truncate_queries=True,
                          backend_instance=make_backend(ours))
    assert len(caught) == 1 and caught[0].filename == __file__
    words = str(caught[0].message)
    assert words.startswith("precision='fp16', threads=2 ignored: ") and "make_backend(bundle, ...)" in words
    with pytest.warns(SetupWarning, match=r"^truncate_queries=True ignored"):
        StreamingDetector(ours, truncate_queries=True, text_encoder=text_encoder_for(ours))
    with warnings.catch_warnings():
        warnings.simplefilter("error", SetupWarning)  # the defaults beside given parts: nothing to say
        StreamingDetector(ours, backend_instance=make_backend(ours), text_encoder=text_encoder_for(ours))


def test_the_parts_are_made_from_a_bundles_path_as_from_the_loaded_bundle(bundles):
    """As StreamingDetector takes a path: make_backend(path) and text_encoder_for(path) failed on a missing attribute
    ('str' object has no attribute 'text_graph')."""
    path = str(bundles["ours"].root)
    shared = StreamingDetector(path, backend_instance=make_backend(path), text_encoder=text_encoder_for(path))
    assert shared.backend.spec == make_backend(bundles["ours"]).spec
    with pytest.raises(UserError, match=r"^a bundle is a path \(a str or a pathlib.Path\), not a int$"):
        text_encoder_for(3)


def test_a_bundle_made_from_its_path_alone_is_refused_naming_load_bundle(bundles):
    """Bundle is public, and Bundle(path) failed as "missing 1 required positional argument: 'manifest'"."""
    from sdqes_edge.runtime import Bundle

    path = str(bundles["ours"].root)
    with pytest.raises(UserError, match=rf"^a bundle is read with load_bundle\('{re.escape(path)}'\), which checks "):
        Bundle(path)
