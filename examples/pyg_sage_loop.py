#!/usr/bin/env python
"""PyG's GraphSAGE trained by PyG's own mini-batch loop, with neutronorch's NeighborLoader as the loader.

    python examples/pyg_sage_loop.py                       # a small synthetic graph, well under a minute
    python examples/pyg_sage_loop.py --dataset DIR --fanouts 15,10,5 --batch-size 1024 --hidden 256

The loop is PyG's example loop (``for batch in loader: out = model(batch.x, batch.edge_index)
[:batch.batch_size]``); only the loader comes from neutronorch. Needs torch-geometric, not its sampler
backends (pyg-lib, torch-sparse): neutronorch samples. ``--trim`` passes the per-hop counts, so that each
layer only computes the vertices the layers above still need (PyG's ``trim_to_layer``).
"""

import argparse
import time

import torch
import torch.nn.functional as F
from torch_geometric.nn import GraphSAGE

from neutronorch.data import load_dataset
from neutronorch.loader import NeighborLoader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="synthetic:nodes=10000,degree=10,features=32,classes=6")
    parser.add_argument("--fanouts", default="10,5")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.005)
    parser.add_argument("--trim", action="store_true", help="trim each layer to the vertices it still needs")
    args = parser.parse_args()
    torch.manual_seed(0)

    graph = load_dataset(args.dataset)  # or neutronorch.from_pyg(data) for a PyG Data you hold
    train_loader = NeighborLoader(graph, args.fanouts, args.batch_size, seeds="train", shuffle=True)
    test_loader = NeighborLoader(graph, args.fanouts, 4 * args.batch_size, seeds="test", shuffle=False)
    model = GraphSAGE(graph.feature_dim, args.hidden, len(train_loader.fanouts), graph.num_classes, dropout=0.5)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    def forward(batch):
        if args.trim:
            return model(batch.x, batch.edge_index, num_sampled_nodes_per_hop=batch.num_sampled_nodes,
                         num_sampled_edges_per_hop=batch.num_sampled_edges)
        return model(batch.x, batch.edge_index)

    def train() -> float:
        model.train()
        total_loss = total = 0
        for batch in train_loader:  # each pass over the loader is the next epoch (new order, new draws)
            batch = batch.to_pyg()
            optimizer.zero_grad()
            out = forward(batch)[:batch.batch_size]
            loss = F.cross_entropy(out, batch.y[:batch.batch_size])
            loss.backward()
            optimizer.step()
            total_loss += loss.item() * batch.batch_size
            total += batch.batch_size
        return total_loss / total

    @torch.no_grad()
    def test() -> float:
        model.eval()
        correct = total = 0
        for batch in test_loader:
            batch = batch.to_pyg()
            pred = forward(batch)[:batch.batch_size].argmax(dim=-1)
            correct += int((pred == batch.y[:batch.batch_size]).sum())
            total += batch.batch_size
        return correct / total

    print(f"{graph.describe()}; {len(train_loader)} batches per epoch")
    for epoch in range(args.epochs):
        start = time.perf_counter()
        loss = train()
        seconds = time.perf_counter() - start
        print(f"epoch {epoch}: loss {loss:.4f}, test accuracy {test():.4f}, {seconds:.2f} s")


if __name__ == "__main__":
    main()
