"""Tasks and metrics: multi-class, binary and multi-label labels, unlabelled vertices, each metric."""

import json

import numpy as np
import pytest
import torch

from neutronorch import TrainConfig, train
from neutronorch.cli import main
from neutronorch.data import SyntheticSpec, generate
from neutronorch.train.task import Task, score

RNG = np.random.default_rng(0)


def _pairwise_auc(scores, labels):
    pos, neg = scores[labels == 1], scores[labels == 0]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return wins / (len(pos) * len(neg))


def test_roc_auc_is_the_share_of_positive_negative_pairs_ranked_right_ties_half():
    labels = RNG.integers(0, 2, 300)
    scores = np.round(RNG.random(300) + 0.3 * labels, 1)  # many ties
    probabilities = np.stack([1 - scores / 2, scores / 2], axis=1)
    assert score("rocauc", False, 2, probabilities, labels) == pytest.approx(_pairwise_auc(scores, labels))
    # More classes: one-vs-rest areas of the class probabilities, averaged.
    labels3 = RNG.integers(0, 3, 200)
    probabilities3 = RNG.dirichlet(np.ones(3), 200)
    want = np.mean([_pairwise_auc(probabilities3[:, c], (labels3 == c).astype(int)) for c in range(3)])
    assert score("rocauc", False, 3, probabilities3, labels3) == pytest.approx(want)


def test_f1_and_accuracy_against_hand_counts():
    labels = np.array([0, 0, 1, 1, 2, 2, -1])
    predicted = np.array([0, 1, 1, 1, 2, 0, 2])  # the unlabelled vertex is left out
    probabilities = np.eye(3)[predicted]
    assert score("accuracy", False, 3, probabilities, labels) == pytest.approx(4 / 6)
    assert score("f1-micro", False, 3, probabilities, labels) == pytest.approx(4 / 6)
    f1 = [2 * 1 / (2 + 1 + 1), 2 * 2 / (4 + 1 + 0), 2 * 1 / (2 + 0 + 1)]  # per class: 2TP / (2TP + FP + FN)
    assert score("f1-macro", False, 3, probabilities, labels) == pytest.approx(np.mean(f1))


def test_multi_label_metrics_leave_unknown_entries_and_one_sided_tasks_out():
    labels = np.array([[1, 0, 1], [0, 0, -1], [1, 0, 0], [0, 0, 1]])  # task 1 has no positive
    probabilities = np.array([[0.9, 0.2, 0.7], [0.2, 0.1, 0.9], [0.6, 0.3, 0.2], [0.4, 0.4, 0.4]])
    want = np.mean([_pairwise_auc(probabilities[:, 0], labels[:, 0]),
                    _pairwise_auc(probabilities[[0, 2, 3], 2], labels[[0, 2, 3], 2])])
    assert score("rocauc", True, 3, probabilities, labels) == pytest.approx(want)
    decided = (probabilities > 0.5).astype(int)
    known = labels >= 0
    assert score("accuracy", True, 3, probabilities, labels) == pytest.approx((decided == labels)[known].mean())
    tp = ((decided == 1) & (labels == 1)).sum()
    fp = ((decided == 1) & (labels == 0)).sum()
    fn = ((decided == 0) & (labels == 1)).sum()
    assert score("f1-micro", True, 3, probabilities, labels) == pytest.approx(2 * tp / (2 * tp + fp + fn))


def test_losses_leave_unlabelled_vertices_and_unknown_entries_out():
    logits = torch.randn(5, 3)
    multi = Task(False, 3, "accuracy")
    labels = torch.tensor([0, 2, -1, 1, -1])
    want = torch.nn.functional.cross_entropy(logits[labels >= 0], labels[labels >= 0])
    torch.testing.assert_close(multi.loss(logits, labels), want)
    task = Task(True, 3, "rocauc")
    targets = torch.tensor([[1, 0, -1], [0, 1, 1], [-1, -1, -1], [1, 1, 0], [0, -1, 1]])
    known = targets >= 0
    want = torch.nn.functional.binary_cross_entropy_with_logits(logits[known], targets[known].float())
    torch.testing.assert_close(task.loss(logits, targets), want)


def _multilabel_graph():
    """A synthetic graph whose class id, written in bits, gives three tasks; some entries unknown."""
    graph = generate(SyntheticSpec(nodes=3000, degree=10, features=16, classes=8, noise=0.6))
    bits = ((np.asarray(graph.labels)[:, None] >> np.arange(3)) & 1).astype(np.int8)
    bits[RNG.random(bits.shape) < 0.1] = -1
    graph.labels, graph.num_classes = bits, 3
    graph.validate("multilabel test graph")
    return graph


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["exact", "neutronorch"])
def test_a_multi_label_graph_trains_and_is_scored_by_roc_auc(mode):
    summary = train(TrainConfig(mode=mode, fanouts=[5, 5], hidden=32, batch_size=128, epochs=4, lr=0.01,
                                dropout=0.2, progress=False), graph=_multilabel_graph())
    assert summary["metric"] == "rocauc" and summary["test_rocauc"] == summary["test_acc"]
    assert summary["test_rocauc"] > 0.8 and "val_rocauc" in summary["epochs"][-1]
    f1 = train(TrainConfig(mode=mode, fanouts=[5, 5], hidden=32, batch_size=128, epochs=2, lr=0.01,
                           progress=False, metric="f1-micro", eval_every=0), graph=_multilabel_graph())
    assert f1["metric"] == "f1-micro" and 0 < f1["test_f1_micro"] <= 1


@pytest.mark.slow
def test_predictions_of_a_multi_label_graph_are_rows_of_decisions(tmp_path):
    from neutronorch import predict
    from neutronorch.train.predict import prediction_score

    graph = _multilabel_graph()
    summary = train(TrainConfig(fanouts=[5, 5], hidden=32, batch_size=128, epochs=2, lr=0.01, progress=False,
                                checkpoint_dir=str(tmp_path)), graph=graph)
    probabilities = predict(tmp_path / "best.pt", graph, "test", probabilities=True)
    decisions = predict(tmp_path / "best.pt", graph, "test")
    assert decisions.shape == probabilities.shape == (len(graph.test_idx), 3) and decisions.dtype == np.int8
    assert np.array_equal(decisions, (probabilities > 0.5).astype(np.int8))
    assert prediction_score(graph, "test", probabilities, True) == \
        ("rocauc", pytest.approx(summary["test_rocauc"], abs=1e-5))


@pytest.mark.slow
def test_the_summary_names_the_metric_and_keeps_the_old_keys(tmp_path):
    out = tmp_path / "s.json"
    assert main(["train", "--dataset", "synthetic:nodes=2000,features=8,classes=2", "--metric", "rocauc",
                 "--epochs", "2", "--no-progress", "--summary-json", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["metric"] == "rocauc"
    for key in ("val", "test", "final_val", "final_test"):
        assert summary[f"{key}_rocauc"] == summary[f"{key}_acc"]
    assert summary["epochs"][-1]["test_rocauc"] == summary["epochs"][-1]["test_acc"]


def test_the_loss_of_a_constant_output_is_derived_from_the_loss_used():
    # Cross-entropy: ln C for uniform outputs, the labels' entropy for the best constant output (their
    # frequencies); each is what the loss gives for such outputs.
    labels = np.array([0, 0, 0, 1, 2, 2, -1])
    task = Task(False, 4, "accuracy")
    values = task.constant_losses(labels)
    entropy = -(0.5 * np.log(0.5) + (1 / 6) * np.log(1 / 6) + (1 / 3) * np.log(1 / 3))
    assert sorted(values.values()) == pytest.approx([entropy, np.log(4)])
    known = torch.from_numpy(labels[labels >= 0])
    frequencies = torch.log(torch.tensor([3, 1, 2, 1e-30]) / 6).repeat(known.shape[0], 1)
    assert min(values.values()) == pytest.approx(float(task.loss(frequencies, known)), rel=1e-5)
    balanced = Task(False, 2, "accuracy").constant_losses(np.array([0, 1, 0, 1]))
    assert list(balanced.values()) == [pytest.approx(np.log(2))]  # one value when the two agree
    multilabel = Task(True, 2, "rocauc").constant_losses(np.array([[1, 0], [0, -1], [1, 0], [1, 0]]))
    assert min(multilabel.values()) == pytest.approx(4 * -(0.75 * np.log(0.75) + 0.25 * np.log(0.25)) / 7)


def test_a_split_predicted_as_one_class_or_with_one_row_of_scores_is_a_collapse():
    from neutronorch.train.health import node_collapse

    labels = torch.tensor([0, 1, 2, 1, -1])
    one_class = torch.tensor([[0.1, 2.0, 0.3], [0.5, 3.0, 0.1], [0.0, 1.0, 0.9], [0.2, 2.2, 0.4], [9.0, 0, 0]])
    assert node_collapse(one_class, labels, False) == "one class (1) predicted for every vertex"
    same = torch.tensor([[0.1, 0.2, 0.3]]).repeat(5, 1) + 1e-8 * torch.rand(5, 3)
    assert node_collapse(same, labels, False) == "every vertex given the same scores"
    learnt = torch.eye(3)[torch.tensor([0, 1, 2, 1, 0])]
    assert node_collapse(learnt, labels, False) is None
    assert node_collapse(one_class, torch.tensor([1, 1, 1, 1, -1]), False) is None  # one class present: no sign
    multilabel = torch.tensor([[1, 0], [0, 0], [1, -1]])
    same_rows = torch.tensor([[0.5, -1.0]]).repeat(3, 1)
    assert node_collapse(same_rows, multilabel, True) == "every vertex given the same scores"
    assert node_collapse(torch.tensor([[0.5, -1.0], [0.4, -1.0], [0.5, -1.0]]), multilabel, True) is None
