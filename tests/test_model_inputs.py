"""The PyTorch model's entry points say what they take: a frame of another size, a uint8 image, a numpy array, a
state of another batch or none at all each failed deep inside the image tower ("The size of tensor a (65) must
match the size of tensor b (17)", "'NoneType' object is not iterable"), and a single query text was read as one
query a letter. Checkpoints load from a pathlib.Path as from a str."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from runtime_fixtures import random_model

from sdqes_edge.checkpoints import load_model
from sdqes_edge.errors import UserError


@pytest.fixture(scope="module")
def model():
    return random_model("qrnn").eval()


def frames(*shape: int, dtype=torch.float32) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype)


def test_frames_of_another_layout_size_or_type_are_refused_naming_the_layout_each_call_takes(model):
    size = model.cfg.vision.image_size
    step = rf"\[B, 3, {size}, {size}\]"
    cases = [
        (lambda: model.step(frames(1, 3, 2 * size, 2 * size), model.init_state(1)),
         rf"^step takes frames {step} \(this model's image size is {size}\), not \[1, 3, {2 * size}, {2 * size}\]$"),
        (lambda: model.step(frames(3, size, size), model.init_state(1)), rf"^step takes frames {step} .*, not \[3, "),
        (lambda: model.step(frames(1, 3, size, size, dtype=torch.uint8), model.init_state(1)),
         r"^step takes normalized float frames \(CLIP's transform, or .*Preprocessor\), not torch.uint8$"),
        (lambda: model.step(np.zeros((1, 3, size, size), np.float32), model.init_state(1)),
         rf"^step takes frames as a torch.Tensor {step}, not a ndarray: torch.from_numpy\(frames\)$"),
        (lambda: model.forward_clip(frames(4, 3, size, size)),
         rf"^forward_clip takes frames \[B, T, 3, {size}, {size}\] .*, not \[4, 3, {size}, {size}\]$"),
        (lambda: model.step_frames(frames(1, 3, size, size)), r"^step_frames takes frames \[B, T, 3, "),
    ]
    for call, words in cases:
        with pytest.raises(UserError, match=words):
            call()


def test_a_state_missing_or_of_another_batch_is_refused_saying_how_to_make_one(model):
    size, count = model.cfg.vision.image_size, len(model.init_state(1))
    made = rf"^step takes the state as model.init_state\(batch\) makes it \({count} tensors\) or as the step before "
    with pytest.raises(UserError, match=made + r"returned it, not NoneType$"):
        model.step(frames(1, 3, size, size), None)
    with pytest.raises(UserError, match=made + r"returned it, not list of 2$"):
        model.step(frames(1, 3, size, size), model.init_state(1)[:2])
    with pytest.raises(UserError, match=r"^the state is of 1 stream\(s\) and the frames of 2: make it with "
                                        r"model.init_state\(2\)$"):
        model.step(frames(2, 3, size, size), model.init_state(1))
    with pytest.raises(UserError, match=r"^the state is of 2 stream\(s\) and the frames of 1"):
        model.step_frames(frames(1, 4, 3, size, size), model.init_state(2))


def test_the_checked_entry_points_still_give_the_towers_own_results(model):
    size = model.cfg.vision.image_size
    clip = torch.randn(2, 4, 3, size, size, generator=torch.manual_seed(0))
    with torch.no_grad():
        window = model.forward_clip(clip)
        stepped, state = model.step_frames(clip)
        assert torch.equal(window, model.visual.forward_clip(clip))
        assert torch.equal(stepped, model.visual.step_frames(clip)[0])
        embedding, _ = model.step(clip[:, 0], model.init_state(2))
    assert torch.equal(embedding, stepped[:, 0]) and len(state) == len(model.init_state(2))


def test_one_query_text_is_one_query_not_one_a_letter(model):
    text = "when the kettle boils"
    with torch.no_grad():
        assert torch.equal(model.encode_text(text), model.encode_text([text]))  # was: "a query is empty" (the spaces)
    with pytest.raises(UserError, match=r"^encode_text takes a query text, a list of them or token ids, not a "
                                        r"NoneType$"):
        model.encode_text(None)


@pytest.mark.parametrize("batch", [0, -1, "2", 1.0, True])
def test_a_state_for_no_streams_or_a_count_that_is_not_whole_is_refused(model, batch):
    """torch's words: "Trying to create tensor with negative dimension -1", "must be tuple of ints"; 0 made an empty
    state that failed at the first step."""
    with pytest.raises(UserError, match=rf"^init_state takes the number of streams, a whole number of at least 1, "
                                        rf"not {re.escape(repr(batch))}$"):
        model.init_state(batch)


def test_a_checkpoint_loads_from_a_pathlib_path_as_from_its_text(model, tmp_path):
    path = tmp_path / "model.pt"
    torch.save(model.clip_state_dict(), path)
    loaded, _ = load_model(path, config=model.cfg)  # failed: 'PosixPath' object has no attribute 'endswith'
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))
    with pytest.raises(UserError, match=r"^load_model takes a path \(a str or a pathlib.Path\), not a int$"):
        load_model(3)
