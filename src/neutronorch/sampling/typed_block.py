"""The typed block's former home: ``TypedBlock``, ``typed_pyg_form`` and ``hop_counts`` are ``sampling.block``'s,
the one block module; ``TypedSubgraph`` is its ``SampledSubgraph``."""

from neutronorch.sampling.block import (RelationType, SampledSubgraph, TypedBlock, TypedPygForm,  # noqa: F401
                                        hop_counts, typed_pyg_form)

TypedSubgraph = SampledSubgraph
