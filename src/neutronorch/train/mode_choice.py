"""``mode="auto"`` resolved for a run (docs/gpu.md, Choosing a mode): from its checkpoint when resumed, else
by the cost model of ``orchestration/choice.py``, with a short measured probe on a copy of the model where it
asks for one: the run's weights, optimizer and random state are untouched.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import logging
import time

import torch

from neutronorch.capabilities import AUTO, MODES, NEUTRONORCH_SETTINGS
from neutronorch.config import TrainConfig
from neutronorch.data import Graph, TypedGraph
from neutronorch.data.times import has_vertex_times
from neutronorch.errors import ConfigError
from neutronorch.observe import Spans
from neutronorch.nn.link import optimizer_groups
from neutronorch.orchestration.choice import (CPU_ADVICE, CPU_REASON, ModeChoice, choose_mode, mode_facts,
                                               probe_candidates)
from neutronorch.orchestration.factory import Threads, build_mode
from neutronorch.train.distributed import World
from neutronorch.train.optim import Adam
from neutronorch.train.step import TRAINER_STAGES, train_step

logger = logging.getLogger("neutronorch")

PROBE_STEPS = 16  # timed mini-batches per candidate mode
PROBE_RATIO = 0.2  # NeutronOrch's hot ratio in the probe when it is auto (which starts with nothing hot)


def resolve_mode(config: TrainConfig, graph: Graph, device: torch.device, threads: Threads, model: torch.nn.Module,
                 world: World | None = None, resumed: dict | None = None, probe=None,
                 loss_fn=None) -> ModeChoice | None:
    """With ``mode`` auto: set ``config.mode`` to the chosen mode and return the choice (None otherwise).
    ``resumed``: the checkpoint the run continues, whose mode it keeps. ``probe(config, graph, device, model,
    threads, names)``: the measurement (default ``probe_modes``, its steps with the task's ``loss_fn``; tests
    inject timings). A typed graph's auto is one mode (``capabilities.AUTO``)."""
    if config.mode != "auto":
        return None
    world = world or World()
    saved = resumed["config"].get("mode") if resumed is not None else None
    if saved in MODES:
        earlier = resumed.get("mode_choice") or {}
        why = earlier.get("reason")
        reason = ("resumed in the mode the run was given" if why is None else why if why.startswith("resumed")
                  else f"resumed in the mode the run chose: {why}")
        choice = ModeChoice(saved, reason, earlier.get("measured", {}))
    elif timed(graph, config.task):
        choice = ModeChoice("exact", "a graph with times is sampled by time in exact mode only (docs/temporal.md)",
                            None)
    elif isinstance(graph, TypedGraph):
        choice = ModeChoice(AUTO["typed"], f"auto picks {AUTO['typed']} mode for typed graphs", None)
    else:
        facts = mode_facts(config, graph, device, world.distributed)
        names = probe_candidates(facts)
        reuses = getattr(model, "reuses", True)  # a user's model without its bottom layer apart cannot
        names = tuple(name for name in names if reuses or name != "neutronorch")
        measure = probe or (lambda *args: probe_modes(*args, loss_fn=loss_fn))
        timings = measure(config, graph, device, model, threads, names) if names else None
        choice = choose_mode(facts, timings)
        if choice.chosen == "neutronorch" and not reuses:
            choice = ModeChoice("device", f"{choice.reason}; but the model has no bottom layer apart for "
                                "NeutronOrch's reuse (docs/models.md, 'Your own model')", choice.measured)
    if world.distributed:  # every rank trains in rank 0's mode
        index = torch.tensor([MODES.index(choice.chosen) + 1 if world.main else 0], dtype=torch.int64)
        agreed = MODES[int(world.all_reduce_(index, "agreeing on the mode")) - 1]
        if agreed != choice.chosen:
            choice = ModeChoice(agreed, f"rank 0's choice (this rank's: {choice.chosen})", choice.measured)
    config.mode = choice.chosen
    logger.info(f"mode auto: {choice.chosen} ({choice.reason})")
    refuse_ignored(config, choice)
    return choice


def check_auto(config: TrainConfig, device: torch.device) -> None:
    """``mode`` auto training on the CPU: exact mode by rule (``choose_mode``), so NeutronOrch's settings are
    refused before any data is read. A resumed run keeps its checkpoint's mode: checked once that is read
    (``resolve_mode``), as is a GPU's choice."""
    if config.mode == "auto" and device.type != "cuda" and not config.resume:
        refuse_ignored(config, ModeChoice("exact", CPU_REASON))


def refuse_ignored(config: TrainConfig, choice: ModeChoice) -> None:
    """Refuse the NeutronOrch settings given to a run for which ``mode`` auto chose another mode, which would
    ignore them: naming the mode, why it was chosen, and the fix."""
    given = config.settings_given(NEUTRONORCH_SETTINGS) if choice.chosen != "neutronorch" else []
    if given:
        it, why = "it" if len(given) == 1 else "them", choice.reason.removesuffix(CPU_ADVICE)
        raise ConfigError(f"{', '.join(given)}: NeutronOrch mode's, and `mode` auto chose {choice.chosen} mode, which "
                          f"would ignore {it} ({why}). Give `mode` neutronorch to use {it}, or leave {it} out.")


def probe_modes(config: TrainConfig, graph: Graph, device: torch.device, model: torch.nn.Module, threads: Threads,
                names: tuple[str, ...], steps: int = PROBE_STEPS, loss_fn=None) -> dict[str, dict]:
    """Per mode of ``names``: seconds per mini-batch (``step_s``) over ``steps`` training steps after a warm-up of
    one super-batch, and each lane's busy seconds per mini-batch (``lanes``), on a copy of ``model``."""
    out, level = {}, logger.level
    hot_ratio = config.hot_ratio if isinstance(config.hot_ratio, float) else PROBE_RATIO
    logger.setLevel(max(level, logging.WARNING))  # the candidates' builds would log what the run's build logs
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            for name in names:
                probed = dataclasses.replace(config, mode=name, epochs=1, hot_ratio=hot_ratio, snapshot_lead=2
                                             if config.snapshot_lead is None else config.snapshot_lead)
                out[name] = _time_mode(probed, graph, device, model, threads, steps, loss_fn)
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()  # the candidate's cache and buffers, before the next one's
    finally:
        logger.setLevel(level)
    return out


def _time_mode(config: TrainConfig, graph: Graph, device: torch.device, model: torch.nn.Module, threads: Threads,
               steps: int, loss_fn=None) -> dict:
    spans = Spans()
    mode = build_mode(config, graph, device, threads, spans)
    trained = copy.deepcopy(model)
    optimizer = Adam(optimizer_groups(trained, config.lr), lr=config.lr, weight_decay=config.weight_decay)
    warmup = min(config.super_batch, mode.num_batches // 2)
    done, started = 0, time.perf_counter()
    try:
        mode.start(trained)
        with mode.batches(0) as batches:
            for batch in batches:
                if done == warmup:
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    started = time.perf_counter()
                    spans.take()
                train_step(trained, optimizer, mode, batch, spans, loss_fn=loss_fn)
                done += 1
                if done == warmup + steps:
                    break
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - started
        stages, _ = spans.take()
        lanes = TRAINER_STAGES.merge(mode.stages).lane_seconds(stages)
    finally:
        mode.close()
    timed = max(1, done - warmup)
    return {"step_s": round(seconds / timed, 5), "steps": timed,
            "lanes": {lane: round(s / timed, 5) for lane, s in lanes.items()}}


def timed(graph, task: str) -> bool:
    """Whether ``graph``'s ``task`` is sampled by time (docs/temporal.md): a link split with times, or a node
    task on vertex times."""
    links = getattr(graph, "links", None)
    return (links is not None and links.timed) or (task == "node" and has_vertex_times(graph))
