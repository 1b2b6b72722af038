# Set-up and the two everyday commands. `make demo` trains on a built-in synthetic graph; `make test`
# runs the test suite (`make test-fast`: the unit tests only). Both create the virtual environment on first use.
# TORCH_SPEC picks the PyTorch build: the default is the CPU wheel; on a GPU machine use your CUDA build,
# e.g. `make demo TORCH_SPEC=torch` or an existing environment (VENV=/path/to/venv).
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.neutronorch-installed

.PHONY: demo test test-fast clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -c "import torch" 2>/dev/null || $(VENV)/bin/pip install -q "$(TORCH_SPEC)"
	$(VENV)/bin/pip install -q -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/neutronorch train --epochs 5

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q

# The unit suite alone: no end-to-end training runs (tests marked slow).
test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m "not slow"

clean:
	rm -rf $(VENV) build src/*.egg-info
