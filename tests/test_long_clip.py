"""Long-CLIP checkpoints (Zhang et al., ECCV 2024: CLIP's text positions stretched from 77 to 248) load, and a
query of up to 248 tokens is encoded as Long-CLIP's own encode_text encodes it, through the bundle's text graph
too. Its checkpoint keeps two position tables, ``positional_embedding`` for the first 20 tokens and
``positional_embedding_res`` for the others (masks made in its __init__, never saved); the reader joins them into
the one table CLIP's text tower takes. Before, the second table was "unexpected" and the checkpoint refused."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from sdqes_edge.checkpoints import load_resolving_unstored
from sdqes_edge.config import preset
from sdqes_edge.errors import UserError
from sdqes_edge.model import SDQESModel
from sdqes_edge.tokenizer import default_tokenizer

CONTEXT = 248
KEPT = 20  # positions Long-CLIP takes from CLIP's own table
LONG_QUERY = "when I start to " + " and then ".join(["wipe the kitchen table"] * 24)  # about 150 tokens


def long_clip_checkpoint(path, seed: int = 0):
    """A small Long-CLIP checkpoint as its training saves one: CLIP's keys, 248 positions, the second table."""
    cfg = preset("tiny")
    cfg = dataclasses.replace(cfg, text=dataclasses.replace(cfg.text, context_length=CONTEXT))
    torch.manual_seed(seed)
    state = SDQESModel(cfg).eval().clip_state_dict()
    width = state["positional_embedding"].shape[1]
    state["positional_embedding"] = 0.01 * torch.randn(CONTEXT, width)
    state["positional_embedding_res"] = 0.01 * torch.randn(CONTEXT, width)
    torch.save(state, path)
    return state


def long_clip_encode_text(model: SDQESModel, state: dict, text: str) -> torch.Tensor:
    """Long-CLIP's encode_text, written out: its two masked tables added to the token embeddings, then CLIP's
    text transformer (the loaded model's blocks), the end token's row, the projection; normalized."""
    tower = model.text
    ids = torch.from_numpy(default_tokenizer(CONTEXT).tokenize([text]))
    mask1, mask2 = torch.zeros(CONTEXT, 1), torch.zeros(CONTEXT, 1)
    mask1[:KEPT], mask2[KEPT:] = 1, 1
    x = tower.token_embedding(ids) + state["positional_embedding"] * mask1 + state["positional_embedding_res"] * mask2
    for block in tower.transformer.resblocks:
        x = block(x, tower.attn_mask)
    x = tower.ln_final(x)[torch.arange(1), ids.argmax(dim=-1)] @ tower.text_projection
    return x / x.norm(dim=-1, keepdim=True)


def test_a_long_clip_checkpoint_encodes_long_queries_as_long_clip_does(tmp_path):
    state = long_clip_checkpoint(tmp_path / "longclip-tiny.pt")
    model, loaded, _ = load_resolving_unstored(str(tmp_path / "longclip-tiny.pt"))
    assert loaded.source_format == "long-clip" and model.cfg.text.context_length == CONTEXT
    assert 77 < int((default_tokenizer(CONTEXT).tokenize([LONG_QUERY]) > 0).sum()) < CONTEXT
    with torch.no_grad():
        assert torch.equal(model.encode_text([LONG_QUERY]), long_clip_encode_text(model, state, LONG_QUERY))


def test_its_bundle_encodes_a_long_query_as_pytorch_does(tmp_path):
    from sdqes_edge.export import ExportOptions, Query, export_bundle
    from sdqes_edge.runtime.bundle import load_bundle
    from sdqes_edge.runtime.queries import text_encoder_for

    long_clip_checkpoint(tmp_path / "longclip-tiny.pt", seed=1)
    model, _, _ = load_resolving_unstored(str(tmp_path / "longclip-tiny.pt"))
    export_bundle(model, tmp_path / "bundle", ExportOptions(show_progress=False, queries=(Query(LONG_QUERY, "Done."),)),
                  log=lambda m: None)
    bundle = load_bundle(tmp_path / "bundle")
    assert bundle.manifest["tokenizer"]["context_length"] == CONTEXT
    other = LONG_QUERY.replace("wipe", "dry")  # not pre-encoded: through the bundle's text graph
    with torch.no_grad():
        expected = model.encode_text([other])[0].numpy()
    np.testing.assert_allclose(text_encoder_for(bundle).encode(other), expected, rtol=0, atol=1e-5)


def test_position_tables_that_do_not_match_are_refused(tmp_path):
    state = long_clip_checkpoint(tmp_path / "longclip-tiny.pt")
    state["positional_embedding_res"] = state["positional_embedding_res"][:100]
    torch.save(state, tmp_path / "cut.pt")
    with pytest.raises(UserError, match=r"^a Long-CLIP checkpoint has positional_embedding and "
                                        r"positional_embedding_res of one shape, over 20 positions; this one has "
                                        r"\(248, 64\) and \(100, 64\): is it complete\?$"):
        load_resolving_unstored(str(tmp_path / "cut.pt"))


def test_the_command_line_takes_a_query_over_77_tokens_for_a_long_clip_checkpoint(tmp_path, capsys):
    """`export` checks its options before reading the checkpoint, when the model's text positions are not yet
    known: a query's length is judged once they are (it was refused against CLIP's 77 before the file was read)."""
    from sdqes_edge.cli import run

    long_clip_checkpoint(tmp_path / "longclip-tiny.pt")
    run(["export", "--checkpoint", str(tmp_path / "longclip-tiny.pt"), "--query", LONG_QUERY, "--out",
         str(tmp_path / "bundle"), "--quiet"])
    from sdqes_edge.runtime.bundle import load_bundle

    assert [q["text"] for q in load_bundle(tmp_path / "bundle").queries()[0]] == [LONG_QUERY]
    code = run(["export", "--checkpoint", str(tmp_path / "longclip-tiny.pt"), "--query", "wipe " * 250, "--out",
                str(tmp_path / "other"), "--quiet"])
    assert code == 2 and not (tmp_path / "other").exists()
    assert "error: query is 252 tokens, over the model's limit of 248" in capsys.readouterr().err


def test_tokenize_and_inspect_count_against_a_bundles_own_positions(tmp_path, capsys):
    from sdqes_edge.cli import run

    long_clip_checkpoint(tmp_path / "longclip-tiny.pt")
    run(["export", "--checkpoint", str(tmp_path / "longclip-tiny.pt"), "--out", str(tmp_path / "bundle"), "--quiet"])
    capsys.readouterr()
    assert run(["tokenize", "--bundle", str(tmp_path / "bundle"), LONG_QUERY]) == 0
    assert capsys.readouterr().out.startswith("148 tokens")
    assert run(["tokenize", LONG_QUERY]) == 2  # CLIP's 77
    assert "query is 148 tokens, over the model's limit of 77" in capsys.readouterr().err
    assert run(["inspect", str(tmp_path / "bundle"), "--frames", "1"]) == 0
    assert "text encoder: text.onnx (queries up to 248 tokens)" in capsys.readouterr().out
