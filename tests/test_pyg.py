"""Conformance with PyTorch Geometric: each layer, and each model exported with ``to_pyg_model``, computes
what PyG's reference does with the same weights on a full-neighbour block (skipped without PyG)."""

import os
from pathlib import Path

import pytest
import torch

from neutronorch import to_pyg, to_pyg_model
from neutronorch.data import SyntheticSpec, generate
from neutronorch.data.planetoid import load_planetoid
from neutronorch.features.store import FeatureStore
from neutronorch.nn.models import GNN
from neutronorch.train.layerwise import layerwise

pytest.importorskip("torch_geometric")

SHARED = Path(os.environ.get("NEUTRONORCH_DATASETS", Path(__file__).resolve().parents[1].parent / "shared" / "datasets"))
KINDS = [("sage", "symmetric"), ("gcn", "symmetric"), ("gat", "symmetric")]


def _cora():
    if not (SHARED / "cora").exists():
        pytest.skip(f"{SHARED / 'cora'} is absent: point NEUTRONORCH_DATASETS at the real datasets")
    return load_planetoid(SHARED / "cora")


def _synthetic():
    return generate(SyntheticSpec(nodes=1500, degree=8, features=24, classes=5))


def _compare(graph, kind, norm, layers):
    torch.manual_seed(0)
    model = GNN(kind, graph.feature_dim, 16, graph.num_classes, layers, heads=4, gcn_norm=norm).eval()
    ours = layerwise(model, graph, FeatureStore(graph.features, graph.labels), torch.arange(graph.num_nodes),
                     torch.device("cpu"), chunk_size=512)
    reference = to_pyg_model(model).eval()
    data = to_pyg(graph)  # the recipe of docs/models.md
    with torch.no_grad():
        theirs = reference(data.x, data.edge_index)
    assert theirs.shape == ours.shape
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
    return reference


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("kind, norm", KINDS, ids=[k for k, _ in KINDS])
def test_layers_and_models_equal_pyg_on_a_synthetic_graph(kind, norm, layers):
    reference = _compare(_synthetic(), kind, norm, layers)
    names = {"sage": "SAGEConv", "gcn": "GCNConv", "gat": "GATConv"}
    assert all(type(conv).__name__ == names[kind] for conv in reference.convs)  # PyG's own layers


@pytest.mark.shared_data
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("kind, norm", KINDS, ids=[k for k, _ in KINDS])
def test_layers_and_models_equal_pyg_on_cora(kind, norm, layers):
    _compare(_cora(), kind, norm, layers)


def test_gcn_with_mean_normalisation_has_no_pyg_equivalent():
    with pytest.raises(ValueError, match="no PyG equivalent"):
        to_pyg_model(GNN("gcn", 4, 8, 2, 2, gcn_norm="mean"))


def test_models_with_residuals_or_normalisation_are_not_exported():
    with pytest.raises(ValueError, match="plain stacks"):
        to_pyg_model(GNN("sage", 4, 8, 2, 2, residual=True))
    with pytest.raises(ValueError, match="plain stacks"):
        to_pyg_model(GNN("sage", 4, 8, 2, 2, norm="layer"))


def test_graph_block_models_are_not_exported():
    with pytest.raises(ValueError, match="plain stacks"):
        to_pyg_model(GNN("sage", 4, 8, 2, 2, architecture="blocks"))
