"""NeutronOrch's mechanism, one part per module (see ``mode.py`` for the threads and what crosses them):

- ``plan_loop.py``: the planning loop, on the host or in the cold sampler's thread (device sampling);
- ``planner.py`` / ``device_planner.py``: the hot set of a super-batch and where each mini-batch finds it,
  on the host / on the device (the same plan); on a typed graph one per vertex type;
- ``hot_rows.py``: the host thread that computes hot vertices' bottom layer;
- ``cold_sampler.py``: the thread that samples and loads the cold part of each mini-batch;
- ``snapshots.py`` / ``hot_table.py``: the trainer's side of the W0 snapshots / of the hot embeddings;
- ``versions.py``: the snapshot schedule, the versioned buffers and the staleness check;
- ``controller.py`` and ``tuner.py``: the hot ratio and snapshot lead, tuned from measured speed and drift;
- ``batch.py``: the spliced mini-batch; ``stats.py``: what the hot sets did;
- ``mode.py``: the mode the trainer drives, on the trainer's thread, over either kind of graph (``kinds.py``:
  what differs per kind).
"""

from neutronorch.orchestration.neutronorch.mode import NeutronOrchMode

__all__ = ["NeutronOrchMode"]
