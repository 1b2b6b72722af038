"""What a run can train with: every graph kind trains every task in every mode, on one rank or several; the
settings one kind of graph cannot honour; and what the loaders and your own module offer. The one source of
what runs where: the configuration, ``check_run``, the loaders and the docs (``markdown``) read it here.
Torch-free, and like config.py it uses nothing above it."""

from __future__ import annotations

from itertools import product

from neutronorch.config_parts import LinkConfig, NeutronOrchConfig, settings_of
from neutronorch.errors import ConfigError
from neutronorch.nn.names import MODELS, RELATIONAL_ONLY, TYPED_MODELS

KINDS = ("homogeneous", "typed")
MODES = ("exact", "device", "neutronorch")
MODE_CHOICES = MODES + ("auto",)  # auto: one of MODES, chosen when the run starts (orchestration/choice.py)
PARTITIONED_MODES = ("exact", "neutronorch", "auto")  # what `partitions` trains in so far (auto: exact, on the CPU)
TASKS = ("node", "link")
# What auto resolves to where no rules choose (on a homogeneous graph, orchestration/choice.py's rules and probe).
AUTO = {"typed": "exact"}

NOT_YET = "not available for typed graphs yet"
TYPED_DOCS = " docs/heterogeneous.md says what typed graphs train with."

# Settings one kind of graph cannot honour: (kind, settings, values refused (None: any but the default), why);
# a kind "typed node" is a typed graph's node task. ``{it}`` in a reason is "it" or "them", as many settings as
# were given.
UNHONOURED = (
    ("typed node", tuple(f.name for f in settings_of(LinkConfig)), None,
     "a link task's settings, and `task` is node; give `task` link, or leave {it} out."),
    ("typed", ("model",), tuple(m for m in MODELS if m not in TYPED_MODELS),
     f"{NOT_YET}; choose one of {', '.join(TYPED_MODELS)}."),
    ("typed", ("architecture", "residual", "norm"), None, f"{NOT_YET}; leave {{it}} out."),
    ("typed node", ("split",), None, "a typed graph carries its own split on its target type; leave `split` out."),
    ("homogeneous", ("model",), RELATIONAL_ONLY,
     f"a relational model, for typed graphs (several vertex or relation types), and this graph is homogeneous; "
     f"choose one of {', '.join(MODELS)}, or give a typed graph (docs/heterogeneous.md)."),
    ("homogeneous", ("link_relation",), None,
     "a typed graph's relation to predict, and this graph has one vertex type and one relation; leave {it} out."),
    ("homogeneous", ("embedding_storage", "embedding_dir"), None,
     "where a typed graph keeps its featureless types' embedding tables, and this graph has one vertex type and "
     "no tables; leave {it} out."),
)

# Settings only some modes honour: (those modes, the settings, why), refused when `mode` names another; with
# `auto` on a homogeneous graph, when the mode it picks is another (train/mode_choice.py: on the CPU before any
# data is read, elsewhere once it has picked).
MODE_ONLY = (
    (("neutronorch",), tuple(f.name for f in settings_of(NeutronOrchConfig)),
     "NeutronOrch mode's, and `mode` {mode} would ignore {it}; give `mode` neutronorch, or leave {it} out."),
)
NEUTRONORCH_SETTINGS = MODE_ONLY[0][1]
# What a prediction (``predict``, ``embed``) of one kind of graph cannot honour: (kind, argument, the values it
# honours, why the others are refused).
PREDICTION_UNHONOURED = (
    ("homogeneous", "fanouts", (None,), "for a typed graph's checkpoint (a TypedGraph); a homogeneous graph's "
     "predictions read every neighbour of its one vertex type."),
    ("homogeneous", "node_type", (None,), "for a typed graph's checkpoint (a TypedGraph); a homogeneous graph has "
     "one vertex type."),
    ("typed", "scratch_dir", ("auto", None), "a typed graph's predictions hold their rows in memory (a chunk's "
     "samples, or with every neighbour one table per type and layer); give auto or memory."),
)

# What a loader feeding your own loop (loader/) offers: every mode but these.
LOADER_REFUSED = {
    "neutronorch": "`mode` 'neutronorch' is not offered by the loader: NeutronOrch reuses bottom-layer outputs that "
                   "the host computes from a snapshot of the model's weights taken between optimizer steps, and "
                   "checks their staleness against the steps taken, so its batches depend on the model and on "
                   "every step, which train() owns and a loader feeding your own loop does not see. Use `mode` "
                   "exact (sampling and gathering on the host, pipelined) or device (on the training device), or "
                   "train() for NeutronOrch.",
}
LOADER_MODES = tuple(mode for mode in MODES if mode not in LOADER_REFUSED)
# The graphs a loader's task does not take: (kind, task) -> why.
LOADER_KIND_REFUSED = {
    ("typed", "link"): "LinkNeighborLoader takes a homogeneous graph for now; a typed graph's link task (one "
                       "relation's edges) trains through train().",
}
# A graph with edge or vertex times (docs/temporal.md): what does not sample it by time yet refuses it.
TEMPORAL_REFUSED = ("temporal sampling: {name} carries times, and training, predict/embed and a loader without "
                    "`time_attr` would sample it without them and see each seed's future; training samples by time "
                    "the link task (by edge times) and the node task (by vertex times) of the built-in models, on "
                    "either kind of graph (docs/temporal.md). Sample it by time there, with "
                    "NeighborLoader(..., time_attr='edge_time', input_time=...), or drop its times "
                    "(dataclasses.replace(graph, edge_time=None, node_time=None)) to use it as a static graph.")


def check_static(graph) -> None:
    """Refuse ``graph`` if it carries times (``TEMPORAL_REFUSED``)."""
    if getattr(graph, "temporal", False):
        raise ConfigError(TEMPORAL_REFUSED.format(name=graph.name))


# Your own module (train(config, graph, model=module)): the modes it cannot train in, by graph kind. A
# homogeneous module trains in NeutronOrch mode when it exposes its bottom layer (nn/custom.py).
OWN_MODULE_REFUSED = {
    ("typed", "neutronorch"):
        "`mode` neutronorch trains the built-in relational models (`model` sage, rgcn or rgat) on a typed graph: "
        "it computes hot vertices' bottom layer on the host with a copy of the model's bottom layer and snapshots "
        "of its embedding rows, which your own module does not expose. Train your module in `mode` exact or "
        "device.",
}


def check_run(config, kind: str) -> None:
    """Raise ``ConfigError`` for the first setting the run of ``config`` on a graph of ``kind`` cannot honour:
    one its kind of graph cannot, or one only another mode honours."""
    mode = AUTO[kind] if config.mode == "auto" and kind in AUTO else config.mode
    named = mode if mode == config.mode else f"auto (which runs {mode} on a {kind} graph)"
    rules = [(why, config.settings_given(names) if values is None
              else [f"`{name}` {getattr(config, name)}" for name in names if getattr(config, name) in values])
             for rule_kind, names, values, why in UNHONOURED if rule_kind in (kind, f"{kind} {config.task}")]
    rules += [(why, config.settings_given(names))
              for modes, names, why in MODE_ONLY if mode not in (*modes, "auto")]
    for why, given in rules:
        if given:
            why = why.format(it="it" if len(given) == 1 else "them", mode=named)
            raise ConfigError(f"{', '.join(given)}: {why}" + (TYPED_DOCS if kind == "typed" else ""))


def check_prediction(kind: str, **given) -> None:
    """Raise ``ConfigError`` for the first of ``given`` that a prediction on ``kind`` cannot honour."""
    for rule_kind, name, honoured, why in PREDICTION_UNHONOURED:
        if rule_kind == kind and name in given and given[name] not in honoured:
            raise ConfigError(f"`{name}` {given[name]}: {why}")


def markdown() -> str:
    """The tables as docs/architecture.md shows them (``tests/test_docs.py`` checks that it does)."""
    lines = ["| graph | task | mode | one rank | several ranks |", "|---|---|---|---|---|"]
    lines += [f"| {kind} | {task} | {mode} | runs | runs |"
              for kind, task, mode in product(KINDS, TASKS, MODES)]
    lines += ["", "| graph | refuses the settings | because |", "|---|---|---|"]
    for kind, names, values, why in UNHONOURED:
        settings = ", ".join(f"`{name}`" for name in names)
        if values is not None:
            settings += " " + " or ".join(values)
        lines.append(f"| {kind} | {settings} | {why.format(it='them' if len(names) > 1 else 'it')} |")
    for modes, names, why in MODE_ONLY:
        others = " or ".join(m for m in MODES if m not in modes)
        autos = "".join(f", or auto on a {kind} graph" for kind, mode in AUTO.items() if mode not in modes)
        autos += " or wherever it picks another mode (on the CPU, on a graph with times)"
        lines.append(f"| either, in `mode` {others}{autos} | {', '.join(f'`{name}`' for name in names)} | "
                     f"{why.format(it='them', mode=others)} |")
    lines += ["", "The loaders (`NeighborLoader`, on either kind of graph, and `LinkNeighborLoader`, on a homogeneous "
                  "one) offer "
                  f"{' and '.join(LOADER_MODES)} mode; " + " ".join(LOADER_REFUSED.values())]
    lines += [f"Your own module on a {kind} graph: {reason}" for (kind, _), reason in OWN_MODULE_REFUSED.items()]
    lines += ["", "| graph | `predict` and `embed` refuse | because |", "|---|---|---|"]
    for kind, name, honoured, why in PREDICTION_UNHONOURED:
        but = "" if honoured == (None,) else " other than " + " or ".join(
            "None (memory)" if v is None else v for v in honoured)
        lines.append(f"| {kind} | `{name}`{but} | {why} |")
    return "\n".join(lines) + "\n"
