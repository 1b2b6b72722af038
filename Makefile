# Set-up and the two everyday commands. `make demo` trains on a built-in synthetic graph; `make test`
# runs the test suite (`make test-fast`: the unit tests only). Both create the virtual environment on first use.
# TORCH_SPEC picks the PyTorch build: the default is the CPU wheel; on a GPU machine use your CUDA build,
# e.g. `make demo TORCH_SPEC=torch` or an existing environment (VENV=/path/to/venv).
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.neutronorch-installed

.PHONY: demo test test-fast clean

PIP := $(VENV)/bin/pip install --disable-pip-version-check --progress-bar on
# pytest's progress as [done/total] at each line's end, and the slowest tests at the end; TEST_WORKERS processes
# run the tests side by side (pytest-xdist; each imports PyTorch: about 0.5 GB of memory a worker).
TEST_WORKERS ?= 2
PYTEST := $(VENV)/bin/python -m pytest -q -o console_output_style=count --durations=5 -n $(TEST_WORKERS)

$(STAMP): pyproject.toml
	@echo "==> setting up $(VENV) (once: PyTorch, numpy, numba, tqdm, pymetis and the test tools; about a minute)"
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -c "import torch" 2>/dev/null || $(PIP) "$(TORCH_SPEC)"
	$(PIP) -e ".[test,partition]"
	touch $(STAMP)

demo: $(STAMP)
	@echo "==> training GraphSAGE on a synthetic graph of 50,000 vertices for 5 epochs (seconds; a first run also"
	@echo "    compiles the kernels, about 15 s)"
	$(VENV)/bin/neutronorch train --epochs 5

# The tests start about 170 Python processes; the package's modules compiled to bytecode once spare each of them
# compiling its sources again where PYTHONDONTWRITEBYTECODE is set (0.3 s of CPU a process).
BYTECODE := $(VENV)/bin/python -m compileall -q src > /dev/null

test: $(STAMP)
	@echo "==> the whole test suite, the end-to-end runs included (about 7.5 minutes on 2 idle cores; about 9 the"
	@echo "    first time, which also compiles numba's kernels)"
	@$(BYTECODE)
	$(PYTEST)

# The unit suite alone: no end-to-end training runs (tests marked slow).
test-fast: $(STAMP)
	@echo "==> the unit tests (about 2 minutes on 2 cores)"
	@$(BYTECODE)
	$(PYTEST) -m "not slow"

clean:
	rm -rf $(VENV) build src/*.egg-info
