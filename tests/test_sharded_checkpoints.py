"""Weights that transformers' ``save_pretrained`` split into shards (``model-00001-of-00009.safetensors`` ...,
each tensor's shard named in ``model.safetensors.index.json``) load through that index as one checkpoint, with
the ``config.json`` beside them, and give transformers' own embeddings. Before, the index was "a JSON file (a model
config?)", the folder said to pass a file inside it, and a shard alone was "not a CLIP ViT checkpoint: missing
visual.conv1.weight, ...": no way in at all."""

from __future__ import annotations

import json
import os

import pytest
import torch
from test_transformers_layout import our_embeddings, reference_embeddings, transformers_clip

from sdqes_edge.checkpoints import load_resolving_unstored, model_name
from sdqes_edge.errors import UserError

SHARD_SIZE = "300KB"  # the small test model in 9 shards


def bin_shards(model, folder, shards: int = 3) -> str:
    """pytorch_model-0000k-of-0000n.bin and their index, as transformers 4 wrote them (safe_serialization=False;
    transformers 5 writes safetensors only) and as older hub repositories hold them."""
    model.config.to_json_file(str(folder / "config.json"))
    names = list(model.state_dict())
    weight_map = {}
    for k in range(shards):
        shard = f"pytorch_model-{k + 1:05d}-of-{shards:05d}.bin"
        part = {name: model.state_dict()[name] for name in names[k::shards]}
        torch.save(part, folder / shard)
        weight_map.update(dict.fromkeys(part, shard))
    index = folder / "pytorch_model.bin.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return str(index)


@pytest.mark.parametrize("kind", ["safetensors", "bin"])
def test_sharded_weights_load_through_their_index_and_give_transformers_own_embeddings(kind, tmp_path):
    reference = transformers_clip("gelu", seed=2)
    if kind == "safetensors":
        reference.save_pretrained(tmp_path, max_shard_size=SHARD_SIZE)
        index = str(tmp_path / "model.safetensors.index.json")
    else:
        index = bin_shards(reference, tmp_path)
    assert len(set(json.loads(open(index).read())["weight_map"].values())) > 1
    model, loaded, unstored = load_resolving_unstored(index)
    assert loaded.source_format == "transformers-clip" and "(from config.json)" in unstored.rule
    assert (model.cfg.vision.heads, model.cfg.vision.mlp_activation) == (4, "gelu")
    for ours, theirs in zip(our_embeddings(model), reference_embeddings(reference)):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=2e-6)


def test_the_checkpoints_identity_covers_every_shard(tmp_path):
    transformers_clip().save_pretrained(tmp_path, max_shard_size=SHARD_SIZE)
    index = str(tmp_path / "model.safetensors.index.json")
    _, before, _ = load_resolving_unstored(index)
    transformers_clip(seed=5).save_pretrained(tmp_path, max_shard_size=SHARD_SIZE)  # same index, other weights
    _, after, _ = load_resolving_unstored(index)
    assert before.sha256 != after.sha256


def test_a_bundle_from_sharded_weights_is_named_for_their_folder():
    assert model_name("hub/clip-vit-large-patch14/model.safetensors.index.json") == "clip-vit-large-patch14"


@pytest.fixture
def sharded(tmp_path):
    transformers_clip().save_pretrained(tmp_path, max_shard_size=SHARD_SIZE)
    return tmp_path


def test_a_shard_alone_or_the_folder_is_pointed_to_the_index(sharded):
    index = sharded / "model.safetensors.index.json"
    with pytest.raises(UserError, match=f"^{sharded}/model-00001-of-00009.safetensors is one shard of sharded "
                                        f"weights; pass the index that lists them all, {index}$"):
        load_resolving_unstored(str(sharded / "model-00001-of-00009.safetensors"))
    with pytest.raises(UserError, match=f"^checkpoint {sharded} is a folder of sharded weights; pass the index that "
                                        f"lists the shards, {index}$"):
        load_resolving_unstored(str(sharded))


def edit_index(folder, change) -> str:
    path = folder / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    change(index["weight_map"])
    path.write_text(json.dumps(index))
    return str(path)


def test_a_missing_shard_is_named(sharded):
    os.remove(sharded / "model-00003-of-00009.safetensors")
    with pytest.raises(UserError, match="^shard model-00003-of-00009.safetensors, listed in .*, is missing; download "
                                        "every file the index lists$"):
        load_resolving_unstored(str(sharded / "model.safetensors.index.json"))


def test_an_index_naming_a_file_outside_its_folder_reads_nothing_there(sharded, tmp_path_factory):
    outside = tmp_path_factory.mktemp("elsewhere") / "weights.safetensors"
    outside.write_bytes((sharded / "model-00001-of-00009.safetensors").read_bytes())
    index = edit_index(sharded, lambda m: m.update({k: str(outside) for k in list(m)[:1]}))
    with pytest.raises(UserError, match=f"names '{outside}', which is not a file beside it; shards are read from "
                                        "the index's folder only$"):
        load_resolving_unstored(index)
    index = edit_index(sharded, lambda m: m.update({k: "../weights.safetensors" for k in list(m)[:1]}))
    with pytest.raises(UserError, match="names '../weights.safetensors', which is not a file beside it"):
        load_resolving_unstored(index)


def test_an_index_listing_a_tensor_its_shards_lack_is_refused(sharded):
    index = edit_index(sharded, lambda m: m.update({"visual.extra_tensor": "model-00001-of-00009.safetensors"}))
    with pytest.raises(UserError, match=r"lists 1 tensor\(s\) that its shards lack \(visual.extra_tensor first\)"):
        load_resolving_unstored(index)


def test_an_index_that_is_not_one_is_refused(sharded):
    (sharded / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(UserError, match="^cannot read the shard index .*: expected JSON with a 'weight_map'"):
        load_resolving_unstored(str(sharded / "model.safetensors.index.json"))


def test_huggingface_hubs_cache_of_sharded_weights_loads_through_its_links(tmp_path):
    """huggingface_hub keeps each file once under blobs/ and links it into snapshots/<revision>/ by its plain name:
    the shards the index names are links beside it, which are followed; the bundle is named for the repository."""
    saved = tmp_path / "saved"
    transformers_clip().save_pretrained(saved, max_shard_size=SHARD_SIZE)
    repo = tmp_path / "hub" / "models--openai--clip-tiny"
    snapshot = repo / "snapshots" / ("0" * 40)
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for k, file in enumerate(sorted(saved.iterdir())):
        blob = repo / "blobs" / f"blob{k}"
        file.rename(blob)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    model, loaded, _ = load_resolving_unstored(str(snapshot / "model.safetensors.index.json"))
    assert loaded.source_format == "transformers-clip" and model.cfg.name == "clip-tiny"
