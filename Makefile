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

.PHONY: help install reproduce test quick export readme nbs lab docs clean gpu-prepare gpu-rehearsal

help:
	@echo "make reproduce   install, then run the $(PRESET) preset end to end (results in runs/ and figures/)"
	@echo "make test        install, then nbdev_test (notebooks) and pytest (tests/)"
	@echo "make quick       while developing: pytest without the slow tests (TESTS=tests/test_x.py narrows it)"
	@echo "make export      notebooks -> depthnb/ (nbdev_export), clean notebooks, regenerate README.md"
	@echo "make nbs         re-execute the component notebooks in place (refreshes their stored outputs)"
	@echo "make docs        build the docs site into _docs/ (DOCS_CHECK=1: also check it in headless Chromium)"
	@echo "make lab         JupyterLab on nbs/ with this environment as the kernel"
	@echo "make readme      regenerate README.md from nbs/index.ipynb"
	@echo "make gpu-prepare     build .gpu/ (data, wheels, plan) to carry to GPU jobs (benchmarks/README.md)"
	@echo "make gpu-rehearsal   the GPU plan on the CPU at shrunk shapes: three jobs, a cut, the report"

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

# Two notebooks at once, one thread each: two torch processes with two threads each on two cores run far slower.
# pytest on both cores, a test file per worker: module fixtures (the docs build in _proc/, the pipeline run) once.
test: install
	OMP_NUM_THREADS=1 $(BIN)/nbdev_test --n_workers 2 --timing
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=15 -m "not rehearsal" tests

# The quick subset while developing: pytest without the tests marked `slow` (the rule: tests/conftest.py), on one core
# and the files in TESTS. `make test` still runs everything CI runs.
TESTS ?= tests
quick: install
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -x -m "not slow and not rehearsal" $(TESTS)

export: install
	$(BIN)/nbdev_export
	$(BIN)/nbdev_clean
	$(MAKE) readme

# README.md is nbs/index.ipynb as GitHub Markdown (depthnb.tools.readme, nbs/07_tooling/14_readme.ipynb).
readme: install
	$(BIN)/python -m depthnb.tools.docs_cli readme

# Stored outputs (tables, figures) are what the docs site and GitHub show: refresh them after edits.
NBS ?= $(wildcard nbs/[0-9][0-9]_*/*.ipynb) nbs/index.ipynb
nbs: install
	@for nb in $(NBS); do echo "executing $$nb"; \
	  OMP_NUM_THREADS=2 $(BIN)/jupyter nbconvert --to notebook --execute --inplace \
	    --ExecutePreprocessor.timeout=1800 "$$nb" >/dev/null 2>&1 || { echo "failed: $$nb"; exit 1; }; done
	$(BIN)/nbdev_clean

# The docs site: nbdev's processing, then Sphinx + MyST-NB into _docs/ (nbs/07_tooling/16_docs.ipynb says why).
# Its requirements (depthnb.tools.docs.DOCS_REQUIREMENTS) are installed into the venv on first use.
# `make docs DOCS_CHECK=1` also opens the site in headless Chromium (Debian's chromium package)
# and saves screenshots to runs/docs-screenshots/.
DOCS_CHECK ?=
docs: install
	$(BIN)/python -m depthnb.tools.docs_cli deps $(if $(DOCS_CHECK),--browser)
	$(BIN)/nbdev_sidebar
	$(BIN)/python -m depthnb.tools.docs_cli $(if $(DOCS_CHECK),check,build)
	@echo "site in _docs/: open _docs/index.html, or serve it with $(BIN)/python -m http.server -d _docs"

# JupyterLab on nbs/, with this venv registered as the kernel "Python (depthnb)" (venv-local by
# default; KERNEL_SCOPE=--user registers it for every Jupyter of this user). Notebooks that name the
# plain python3 kernel also run in this venv here. Extra flags: LAB_ARGS="--no-browser --port 8890".
KERNEL_SCOPE ?= --sys-prefix
LAB_ARGS ?=
lab: install
	@$(BIN)/python -c "import jupyterlab" 2>/dev/null || $(BIN)/python -m pip install -q "jupyterlab>=4"
	$(BIN)/python -m ipykernel install $(KERNEL_SCOPE) --name depthnb --display-name "Python (depthnb)"
	$(BIN)/jupyter lab --ServerApp.root_dir=nbs --MultiKernelManager.default_kernel_name=depthnb \
	  $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

clean:
	rm -rf _proc _docs .pytest_cache

# The GPU plan (benchmarks/README.md, "The GPU plan"): build the carried .gpu/ folder, or rehearse the whole
# plan on the CPU at shrunk shapes (three simulated jobs, the second cut mid-pretraining; a few minutes).
gpu-prepare: install
	$(BIN)/python benchmarks/gpu_plan.py prepare

gpu-rehearsal: install
	$(BIN)/python -m pytest -q -m rehearsal tests/test_gpu_plan.py
