import os

# The test workers run side by side on every core (pytest-xdist): OpenMP's idle threads (torch's and numba's)
# spinning for milliseconds before they sleep took cores another worker needed. The unit tests took 157-184 s
# on 2 cores that way, 111 s with idle threads sleeping at once. OpenMP reads this when torch loads it, so it
# is set before anything imports torch; a value the caller set is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402 - after the OpenMP setting
import pytest  # noqa: E402
import torch  # noqa: E402

# Without a GPU, Triton's kernels (the device sampler's) run through its interpreter on CPU tensors; it is
# chosen when a kernel is defined, so before anything imports them.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from neutronorch.data.csc import edges_to_csc


@pytest.fixture(autouse=True, scope="session")
def _scratch_working_folder(tmp_path_factory):
    """The tests run in a scratch folder: a command-line run that names no output keeps its results in
    runs/ under the current folder, which must not be the checkout."""
    before = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    yield
    os.chdir(before)


@pytest.fixture(scope="module")
def one_thread():
    """One torch and one numba thread for a module of tiny tensors (``pytest.mark.usefixtures("one_thread")``):
    with two, on a machine whose cores other work kept busy, each small product or kernel waited milliseconds
    for the second thread (the relational layers' file took a minute)."""
    import numba

    before = torch.get_num_threads(), numba.get_num_threads()
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    yield
    torch.set_num_threads(before[0])
    numba.set_num_threads(before[1])


def pytest_collection_modifyitems(config, items):
    skip_cuda = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "cuda" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_cuda)


@pytest.fixture
def log_reads(monkeypatch):
    """``log_reads()`` starts logging every read of a tensor's values into Python (each a host
    synchronisation on a GPU) by the name of the method, and returns the log; ``monkeypatch.undo()`` stops it."""
    def start() -> list[str]:
        reads = []
        for name in ("item", "tolist", "__int__", "__bool__", "__index__", "__float__", "nonzero", "numpy", "cpu"):
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name,
                                lambda self, *a, _o=original, _n=name, **k: reads.append(_n) or _o(self, *a, **k))
        return reads
    return start


@pytest.fixture
def small_csc():
    """A random directed graph of 300 vertices with varied in-degrees (0 to 60)."""
    rng = np.random.default_rng(7)
    n = 300
    degrees = rng.integers(0, 60, n)
    dst = np.repeat(np.arange(n), degrees)
    src = rng.integers(0, n, dst.shape[0])
    indptr, indices = edges_to_csc(src, dst, n, symmetric=False)
    return indptr, indices
