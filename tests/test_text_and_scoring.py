"""Text tower and scoring: L2-normalized query embeddings, cosine logits, many queries in one product."""

from __future__ import annotations

import torch
from conftest import random_model

from sdqes_edge.model import probability, score


def test_query_embeddings_are_normalized_and_independent_of_the_batch():
    model = random_model("none")
    queries = ["When I start to clean the table, remind me to sanitize my hands.", "the door opens"]
    with torch.no_grad():
        both = model.encode_text(queries)
        alone = model.encode_text(queries[1:])
    assert both.shape == (2, model.cfg.embed_dim)
    assert torch.allclose(both.norm(dim=-1), torch.ones(2), atol=1e-5)
    assert torch.allclose(both[1:], alone, atol=1e-6)


def test_the_end_token_position_decides_the_embedding():
    """CLIP reads the embedding at the end token (argmax of ids), so padding never leaks in."""
    model = random_model("none")
    with torch.no_grad():
        short = model.encode_text(["cooking"])
        longer = model.encode_text(["cooking now"])
    assert not torch.allclose(short, longer)


def test_scores_are_cosines_and_probabilities_their_sigmoid():
    model = random_model("qrnn")
    frames = torch.randn(3, 2, 3, 32, 32)
    with torch.no_grad():
        emb = model.forward_clip(frames)[:, -1]  # [B, E]
        queries = model.encode_text(["a", "b c", "remind me when I start cooking"])
    logits = score(emb, queries)
    assert logits.shape == (3, 3)
    one_by_one = torch.stack([torch.nn.functional.cosine_similarity(emb, q[None], dim=-1) for q in queries], 1)
    assert torch.allclose(logits, one_by_one, atol=1e-6)
    assert torch.allclose(probability(logits), torch.sigmoid(logits))
