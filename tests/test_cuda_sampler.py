"""The torch sampler on CUDA tensors: the numba sampler's draws, its distribution, and ``sample_hop``.

Skipped without a GPU; the same checks run on CPU tensors in ``test_sampler.py``, whose helpers these reuse.
"""

import pytest

from test_sampler import _check_sample_hop, _check_samplers_agree_in_distribution, _check_samplers_draw_the_same

pytestmark = pytest.mark.cuda


def test_cuda_sampler_agrees_with_numba_in_distribution(small_csc):
    _check_samplers_agree_in_distribution(small_csc, "cuda")


def test_cuda_sample_hop_follows_the_contract_and_matches_numba(small_csc):
    _check_sample_hop(small_csc, "cuda")


def test_cuda_sampler_draws_the_numba_samplers_neighbours():
    _check_samplers_draw_the_same("cuda")
