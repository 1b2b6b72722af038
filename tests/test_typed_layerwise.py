"""Full-neighbour inference of typed checkpoints, layer by layer (layerwise.typed_layers, lower_layers)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from neutronorch import TrainConfig, train
from neutronorch.data import synthetic_typed
from neutronorch.errors import CheckpointError
from neutronorch.train import predict as predict_module
from neutronorch.nn.typed_models import reachable_types
from neutronorch.train.predict import embed, predict
from neutronorch.train.checkpoint import load_typed_checkpoint

EVERY = [10**6, 10**6]  # a sampled inference that draws every neighbour (fanouts above every degree)


@pytest.fixture(scope="module")
def graph():
    return synthetic_typed(nodes=3000, train=0.3, val=0.1, seed=0, edge_weights=True)


@pytest.fixture(scope="module", params=["sage", "rgcn", "rgat"])
def checkpoint(request, graph, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    train(TrainConfig(model=request.param, epochs=1, fanouts=[4, 4], hidden=16, batch_size=64, threads=1,
                      device="cpu", checkpoint_dir=str(folder), progress=False), graph=graph)
    return folder / "last.pt"


def test_layer_by_layer_predictions_are_every_neighbours_sampled_ones(graph, checkpoint):
    layered = predict(checkpoint, graph, "test", probabilities=True, fanouts=-1, chunk_size=97)
    sampled = predict(checkpoint, graph, "test", probabilities=True, fanouts=EVERY)
    np.testing.assert_allclose(layered, sampled, atol=1e-5)
    other = predict(checkpoint, graph, "all", fanouts={"default": [-1, -1]}, chunk_size=5000)
    np.testing.assert_array_equal(other[graph.test_idx], layered.argmax(1))


@pytest.mark.parametrize("node_type, layer", [("paper", 1), ("author", 1), ("field", 1), ("paper", 2)])
def test_layer_by_layer_embeddings_are_every_neighbours_sampled_ones(graph, checkpoint, node_type, layer):
    layered = embed(checkpoint, graph, layer=layer, node_type=node_type, fanouts=-1, chunk_size=333)
    sampled = embed(checkpoint, graph, layer=layer, node_type=node_type, fanouts=EVERY)
    assert layered.shape == (graph.num_nodes[node_type], 16 if layer == 1 else graph.num_classes)
    np.testing.assert_allclose(layered, sampled, atol=1e-5)


def test_what_each_layer_computes(graph, checkpoint):
    model = load_typed_checkpoint(checkpoint).model
    sources = {r[0] for r in model.spec.relations if r[2] == "paper"}
    assert [set(t) for t in reachable_types(model.spec, 1, "paper")] == [{"paper"}, {"paper"} | sources]
    assert reachable_types(model.spec, 0, "author") == [["author"]]


@pytest.mark.parametrize("fanouts, full", [(None, False), (-1, True), ([-1, -1], True), ([-1, 5], False),
                                            ({"default": [-1, -1]}, True),
                                            ({"default": [-1, -1], "writes": [3, 3]}, False), ([10, 10], False)])
def test_which_fanouts_ask_for_every_neighbour(graph, checkpoint, monkeypatch, fanouts, full):
    """Layer by layer only when the fanouts given resolve to -1 for every relation and layer."""
    layered = []
    monkeypatch.setattr(predict_module, "typed_layers", lambda *args: layered.append(args) or (lambda ids: 1 / 0))
    if full:
        with pytest.raises(ZeroDivisionError):
            predict(checkpoint, graph, [0], fanouts=fanouts)
    else:
        predict(checkpoint, graph, [0], fanouts=fanouts)
    assert bool(layered) is full


@pytest.mark.parametrize("fanouts", [None, -1])
def test_outputs_that_are_not_numbers_are_refused_sampled_or_layer_by_layer(graph, checkpoint, fanouts, tmp_path):
    damaged = load_typed_checkpoint(checkpoint)
    with torch.no_grad():
        for parameter in damaged.model.dense_parameters():
            parameter.fill_(float("nan"))
    out = tmp_path / "classes.npy"
    with pytest.raises(CheckpointError, match=r"NaN or infinite logits for [\d,]+ of a chunk of [\d,]+ vertices; "
                                              r"nothing"):
        predict(damaged, graph, "test", fanouts=fanouts, out=out)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(CheckpointError, match=r"NaN or infinite layer 1 outputs for [\d,]+ of a chunk of [\d,]+ "
                                              r"author vertices"):
        embed(damaged, graph, layer=1, node_type="author", fanouts=fanouts)
