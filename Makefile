# depthnb: two commands do all the set-up on a fresh machine that has python3.
#   make reproduce   install, then run the main job (the `tiny` preset end to end)
#   make test        install, then nbdev_test over the notebooks and pytest over tests/
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PRESET ?= tiny
# A CPU build of this version is found locally; a bare `torch` requirement would pull CUDA wheels.
TORCH_VERSION ?= 2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.depthnb-installed

.PHONY: help install reproduce test test-fast export clean-nbs readme nbs lab docs clean

help:
	@echo "make reproduce   install, then run the $(PRESET) preset end to end (results in runs/ and figures/)"
	@echo "make test        install, then nbdev_test (notebooks) and pytest (tests/)"
	@echo "make export      notebooks -> depthnb/ (nbdev_export), clean notebooks, regenerate README.md"
	@echo "make nbs         re-execute the component notebooks in place (refreshes their outputs)"

# --system-site-packages lets a PyTorch already installed for this python (a GPU build) be reused.
$(BIN)/python:
	$(PYTHON) -m venv --system-site-packages $(VENV)

# Re-install only when the package metadata changes; torch first, and only if none is importable.
$(STAMP): settings.ini setup.py | $(BIN)/python
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install "torch==$(TORCH_VERSION)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	@touch $@

install: $(STAMP)

reproduce: install
	$(BIN)/depthnb reproduce --preset $(PRESET)

test: install
	$(BIN)/nbdev_test --n_workers 2 --timing
	$(BIN)/python -m pytest -q tests

export: install
	$(BIN)/nbdev_export
	$(BIN)/nbdev_clean
	$(MAKE) readme

readme: install
	$(BIN)/nbdev_proc_nbs --file_glob index.ipynb >/dev/null
	$(BIN)/jupyter nbconvert --to markdown _proc/index.ipynb --output-dir . --output README >/dev/null 2>&1
	@echo "README.md regenerated from nbs/index.ipynb"

nbs: install
	$(BIN)/python -m depthnb.cli run-notebooks

clean:
	rm -rf _proc _docs .pytest_cache
