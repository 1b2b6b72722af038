"""The torch sampler on CUDA tensors: its distribution against the numba sampler, and ``sample_hop``.

Skipped without a GPU; the same checks run on CPU tensors in ``test_sampler.py``, whose helpers these reuse.
"""

import pytest

from test_sampler import _check_sample_hop, _check_samplers_agree_in_distribution

pytestmark = pytest.mark.cuda


def test_cuda_sampler_agrees_with_numba_in_distribution(small_csc):
    _check_samplers_agree_in_distribution(small_csc, "cuda")


def test_cuda_sample_hop_follows_the_contract_and_matches_numba(small_csc):
    _check_sample_hop(small_csc, "cuda")
