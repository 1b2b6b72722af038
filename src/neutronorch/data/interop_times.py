"""Times in PyG and DGL graphs (docs/temporal.md): where each library keeps edge and vertex times, read by
``interop.py``'s readers and written by its exporters. PyG: ``edge_time`` on edges, ``time`` on vertices (or
on edges, when it holds one entry per edge and the graph has not that many vertices), as its
``NeighborLoader(time_attr=...)`` reads them; DGL: ``timestamp`` (or ``time``) in ``edata`` and ``ndata``,
as GraphBolt's temporal samplers are usually given them."""

from __future__ import annotations

import numpy as np

from neutronorch.errors import DataError

DGL_TIME_KEYS = ("timestamp", "time")  # the first is the one written


def _numpy(value) -> np.ndarray:
    return np.asarray(value.detach().cpu().numpy() if hasattr(value, "detach") else value)


def _length(value) -> int:
    shape = getattr(value, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) else -1


def pyg_times(store, num_nodes: int, num_edges: int, name: str, where: str = "") -> dict:
    """``edge_time``/``node_time`` of a PyG ``Data`` (or a ``HeteroData`` store: ``num_nodes`` or
    ``num_edges`` -1 for a store of the other kind): ``edge_time``, and ``time`` by its length."""
    found = {}
    if (edge := getattr(store, "edge_time", None)) is not None:
        found["edge_time"] = edge
    if (time := getattr(store, "time", None)) is not None:
        count = _length(time)
        if count == num_nodes:
            found["node_time"] = time
        elif count == num_edges and "edge_time" not in found:
            found["edge_time"] = time
        else:
            raise DataError(f"{name}{where}: `time` holds {count} entries, neither one per vertex ({num_nodes}) nor "
                            f"one per edge ({num_edges}) not already given by `edge_time`; give vertex times as "
                            f"`time` and edge times as `edge_time`.")
    return {key: _numpy(value) for key, value in found.items()}


def dgl_time(data, name: str, what: str):
    """The times a DGL ``ndata``/``edata`` view holds (``DGL_TIME_KEYS``), or None; two different ones refused."""
    keys = [key for key in DGL_TIME_KEYS if key in data]
    if len(keys) > 1:
        raise DataError(f"{name}: {what} holds both {' and '.join(keys)}; keep one of them as the times.")
    return _numpy(data[keys[0]]) if keys else None


def put_pyg_times(graph, out, torch) -> None:
    """A ``Graph``'s times on the PyG ``Data`` ``out``: ``edge_time`` in ``edge_index``'s order (CSC), ``time``."""
    if graph.edge_time is not None:
        out.edge_time = torch.from_numpy(np.asarray(graph.edge_time))
    if graph.node_time is not None:
        out.time = torch.from_numpy(np.asarray(graph.node_time))


def put_dgl_times(graph, g, torch) -> None:
    """A ``Graph``'s times on the DGL graph ``g`` (edges in CSC order) as ``timestamp``."""
    if graph.edge_time is not None:
        g.edata[DGL_TIME_KEYS[0]] = torch.from_numpy(np.asarray(graph.edge_time))
    if graph.node_time is not None:
        g.ndata[DGL_TIME_KEYS[0]] = torch.from_numpy(np.asarray(graph.node_time))
