"""Train a PyG model, unchanged, with neutronorch's pipeline; then predict from its best checkpoint.

    python examples/pyg_model_train.py                      # a synthetic graph, under a minute on 2 cores
    python examples/pyg_model_train.py --dataset my_graph_dir --epochs 20

Needs torch-geometric (`pip install torch-geometric`; its sampling extensions are not needed).
"""

import argparse
import tempfile

from torch_geometric.nn import GraphSAGE

from neutronorch import TrainConfig, load_dataset, train
from neutronorch.train.checkpoint import load_checkpoint
from neutronorch.train.predict import predict


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="synthetic:nodes=20000,degree=10,features=32,classes=8")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--mode", default="exact", choices=["exact", "device"])
    args = p.parse_args()
    graph = load_dataset(args.dataset)

    def model():  # the PyG model, as a PyG user writes it
        return GraphSAGE(graph.feature_dim, hidden_channels=128, num_layers=2, out_channels=graph.num_classes,
                         dropout=0.5)

    with tempfile.TemporaryDirectory() as folder:
        config = TrainConfig(fanouts=[10, 10], epochs=args.epochs, mode=args.mode, lr=0.01, checkpoint_dir=folder,
                             progress=False)
        summary = train(config, graph=graph, model=model())
        print(f"test accuracy {summary['test_acc']:.4f} at epoch {summary['best_epoch']}, "
              f"{summary['epoch_seconds_median']:.2f} s per epoch")
        best = load_checkpoint(f"{folder}/best.pt", model=model())
        predicted = predict(best, graph, "test")
        print(f"predicted {predicted.shape[0]} test vertices from best.pt: accuracy "
              f"{(predicted == graph.labels[graph.test_idx]).mean():.4f}")


if __name__ == "__main__":
    main()
