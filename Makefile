# The course's commands. `make lab` to learn, `make test` to check everything.
# Both build .venv on first use (and again whenever the pins change).

PYTHON      ?= python3
VENV        ?= .venv
BIN         := $(VENV)/bin
KERNEL_NAME := pytorch2-course# the kernel `python -m course_utils.kit.lab` installs (lab.KERNEL_NAME)
STAMP       := $(VENV)/.course-installed
LAB_ARGS    ?=
PYTEST_ARGS ?=
WORKERS     ?= 2
# notebooks `make workshop-check` runs at once (each in its own kernel); JOBS=1 for one by one
JOBS        ?= 2
# A folder made by `make wheelhouse`: when set, every install reads it alone (pip --no-index), and
# only the files its check verified: `wheelhouse check` writes them with their sha256 to HASHED and
# pip installs that file in hash-checking mode, so a file changed after the check is refused; then the
# course itself with no folder to read (PIP_CONFIG_FILE=/dev/null: no find-links from a pip.conf either).
WHEELHOUSE  ?=
HASHED      := $(VENV)/wheelhouse-requirements.txt
# TORCH=cpu: torch's CPU-only build (torch==2.14.1+cpu, the same versions) from PyTorch's CPU index instead of
# PyPI's CUDA build, for a Linux machine without an NVIDIA GPU; tools/cpu_constraints.py writes the pins. .venv
# remembers the choice in TORCH_FILE, so a later `make test` or `make lab` keeps it (TORCH=default goes back;
# `make clean` forgets it). CI does not exercise it: CI installs from PyPI only.
TORCH_FILE  := $(VENV)/.course-torch
TORCH       ?= $(or $(shell cat $(TORCH_FILE) 2>/dev/null),default)
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
ifeq ($(filter default cpu,$(TORCH)),)
  $(error TORCH=$(TORCH) is not understood: TORCH=cpu installs torch's CPU-only build, TORCH=default PyPI's)
endif
ifeq ($(TORCH)$(if $(WHEELHOUSE),+wheelhouse),cpu+wheelhouse)
  $(error TORCH=cpu with WHEELHOUSE is not supported: a wheelhouse holds the build it was made with)
endif

# JupyterLab refuses to run as root unless asked; only root gets the flag.
ifeq ($(shell id -u 2>/dev/null),0)
  ROOT_FLAG := --allow-root
endif

MIN_VENV    ?= .venv-min
MIN_STAMP   := $(MIN_VENV)/.course-installed

.PHONY: FORCE help setup lab test test-nb test-unit doctor kernel clean constraints execute sources notebooks \
        workshop-check report report-cold stamp test-min gpu-check gpu-bundle test-avx2 test-haswell \
        wheelhouse wheelhouse-install site test-site

help:
	@echo "make lab       set up .venv if needed, then open JupyterLab on notebooks/"
	@echo "make test      set up .venv if needed, then run unit tests and every notebook (quick mode)"
	@echo "make test-nb NB=notebooks/00_setup.ipynb   run one notebook under nbval"
	@echo "make test-unit run only the unit tests"
	@echo "make doctor    check this machine can run the course"
	@echo "make execute NB=notebooks/00_setup.ipynb   re-run a notebook in full mode and store its outputs"
	@echo "make sources   write each notebook's reviewable twin notebooks/src/NN_topic.py (make notebooks: back)"
	@echo "make workshop-check   doctor + every notebook in quick mode, offline: READY or NOT READY (JOBS=2 at a time)"
	@echo "make report    run the course in full mode, then build/report/report.{md,html}"
	@echo "make report-cold  the course in full mode with empty caches (a first run's times)"
	@echo "make stamp     write measured times and 'last passed' into README's table and each notebook"
	@echo "make wheelhouse   download every pinned package into build/wheelhouse (or WHEELHOUSE=DIR), with checksums"
	@echo "make lab WHEELHOUSE=DIR   (or setup, test) install from that folder only, no network, hash-checked"
	@echo "make setup TORCH=cpu   torch's CPU-only build from download.pytorch.org/whl/cpu (Linux without a GPU)"
	@echo "make site      build/site/html: the course as a static HTML book from the stored outputs, built offline"
	@echo "make test-site the site in headless Chromium (tests/test_site.py)"
	@echo "make wheelhouse-install   time a fresh environment built from the wheelhouse in an empty network namespace"
	@echo "make test-min  the whole suite on the oldest supported torch (2.11), in $(MIN_VENV)"
	@echo "make test-avx2 the whole suite as if the CPU had AVX2 only (torch, Inductor, FBGEMM capped)"
	@echo "make test-haswell  notebook 08 and the CPUID checks on qemu's emulated AVX2 CPU (about an hour; needs qemu-user)"
	@echo "make gpu-check every GPU cell of every notebook on this machine's CUDA GPU, with a summary (build/gpu-check)"
	@echo "make gpu-bundle   the wheels a lent GPU machine lacks, for its Python 3.12 (build/gpu-bundle, under 48 MiB)"
	@echo "make executorch  $(ET_VENV) with the tested ExecuTorch pair, and its JupyterLab kernel (notebook 06)"
	@echo "make test-executorch  notebook 06 and tests/test_executorch.py in $(ET_VENV) (quick mode)"
	@echo "make test-next the whole suite on the newest torch family the registry offers (network; $(NEXT_VENV))"
	@echo "make clean     remove .venv, caches and build outputs"

# Before making .venv: is there a Python called $(PYTHON), at the course's floor, with the venv and
# ensurepip modules? tools/check_python.py says what to do (routes without admin rights first) when
# not. A failed `venv` leaves no half-made .venv behind for the next `make` to trust.
$(BIN)/python:
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "make setup: no Python called '$(PYTHON)' on PATH." \
	    "Name a Python 3.11 or newer: make setup PYTHON=/path/to/python3.11. Without admin rights:" \
	    "'uv python install 3.11', Miniforge with environment.yml, or pyenv (README, Two commands)." >&2; exit 1; }
	@$(PYTHON) tools/check_python.py
	$(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); exit 1; }

# Rewritten only when TORCH changes, so .venv is installed again then, and only then.
$(TORCH_FILE): FORCE | $(BIN)/python
	@test "$$(cat $@ 2>/dev/null)" = "$(TORCH)" || echo "$(TORCH)" > $@

FORCE:

# Every venv installs with PIP_INSTALL (--no-compile); then tools/compile_bytecode.py writes the same
# .pyc files pip would, on every core instead of one file after another (a clean clone's main install:
# 151 s with pip's own bytecode step, 88 s + 33 s this way, on the reference machine).
PIP_INSTALL := -m pip install --quiet --no-compile
$(STAMP): pyproject.toml constraints.txt $(TORCH_FILE) $(if $(filter cpu,$(TORCH)),tools/cpu_constraints.py) | $(BIN)/python
ifneq ($(WHEELHOUSE),)
	$(BIN)/python -m course_utils.kit.wheelhouse check $(WHEELHOUSE) --requirements $(HASHED)
	PIP_CONFIG_FILE=/dev/null $(BIN)/python $(PIP_INSTALL) --no-index --find-links $(abspath $(WHEELHOUSE)) --require-hashes -r $(HASHED)
	PIP_CONFIG_FILE=/dev/null $(BIN)/python $(PIP_INSTALL) --no-index --no-build-isolation -c constraints.txt -e ".[dev]"
else ifeq ($(TORCH),cpu)
	$(BIN)/python $(PIP_INSTALL) --upgrade "pip>=24"
	$(BIN)/python tools/cpu_constraints.py --dest build
	$(BIN)/python $(PIP_INSTALL) --no-deps --index-url $(TORCH_CPU_INDEX) -r build/torch-cpu-requirements.txt
	$(BIN)/python $(PIP_INSTALL) -c build/constraints-cpu.txt -e ".[dev]"
else
	$(BIN)/python $(PIP_INSTALL) --upgrade "pip>=24"
	$(BIN)/python $(PIP_INSTALL) -c constraints.txt -e ".[dev]"
endif
	$(BIN)/python tools/compile_bytecode.py
	$(BIN)/python -m course_utils.kit.lab
	@touch $(STAMP)
	@echo "Course environment ready in $(VENV)."

setup: $(STAMP)

kernel: setup
	@$(BIN)/python -m course_utils.kit.lab

# `kernel` first: the course kernel must point at THIS checkout's .venv (another clone may
# have registered it last).
lab: kernel
	$(BIN)/jupyter lab --ServerApp.root_dir=notebooks $(ROOT_FLAG) $(LAB_ARGS)

# Test files run in WORKERS processes (pytest-xdist; WORKERS=0 runs them in this one), one file
# per worker at a time, so each notebook still runs top to bottom in its own fresh kernel.
test: setup
	COURSE_QUICK=1 $(BIN)/python -m pytest -n $(WORKERS) --dist loadfile $(PYTEST_ARGS)

test-unit: setup
	COURSE_QUICK=1 $(BIN)/python -m pytest tests $(PYTEST_ARGS)

test-nb: setup
	@test -n "$(NB)" || { echo "usage: make test-nb NB=notebooks/00_setup.ipynb"; exit 2; }
	COURSE_QUICK=1 $(BIN)/python -m pytest $(NB) $(PYTEST_ARGS)

doctor: setup
	$(BIN)/python -m course_utils doctor

# Stored outputs come from a real full-mode run, never from hand edits.
execute: kernel
	@test -n "$(NB)" || { echo "usage: make execute NB=notebooks/00_setup.ipynb"; exit 2; }
	COURSE_PROGRESS=/dev/null $(BIN)/jupyter nbconvert --to notebook --execute --inplace \
	    --ExecutePreprocessor.kernel_name=$(KERNEL_NAME) --ExecutePreprocessor.timeout=3600 $(NB)
	$(BIN)/python tools/nbclean.py $(NB)
	$(BIN)/python -m course_utils.kit.sources write $(NB)

# Each notebook's reviewable twin, notebooks/src/NN_topic.py (jupytext py:percent, no outputs):
# `make sources` after editing a notebook in Jupyter; `make notebooks` after editing a twin
# (the notebooks take its code and keep the outputs of unchanged cells; re-run them after).
sources: setup
	$(BIN)/python -m course_utils.kit.sources write

notebooks: setup
	$(BIN)/python -m course_utils.kit.sources update

# NETNS=1: inside an empty network namespace where Linux allows it (the output says which mode ran).
workshop-check: setup
	$(BIN)/python -m course_utils workshop-check --jobs $(JOBS) $(if $(filter 1 yes true,$(NETNS)),--netns)

report: setup
	$(BIN)/python -m course_utils report --run

# The whole course in full mode with every cache empty: what a learner's first run costs.
report-cold: setup
	$(BIN)/python -m course_utils report --run --cold

stamp: setup
	$(BIN)/python -m course_utils stamp

# The version floor: the same pins, with torch 2.11 and its torchvision/torchaudio. setuptools>=77: the
# course's own build needs it (pyproject.toml); .venv gets a recent one through torch, while here an older
# Python's bundled one would satisfy torch 2.11 and then fail tests/test_colab.py's offline install.
$(MIN_STAMP): pyproject.toml constraints.txt tools/min_constraints.py
	$(PYTHON) -m venv $(MIN_VENV)
	$(MIN_VENV)/bin/python $(PIP_INSTALL) --upgrade "pip>=24" "setuptools>=77"
	mkdir -p build && $(PYTHON) tools/min_constraints.py > build/constraints-min.txt
	$(MIN_VENV)/bin/python $(PIP_INSTALL) -c build/constraints-min.txt -e ".[dev]"
	$(MIN_VENV)/bin/python tools/compile_bytecode.py
	@touch $(MIN_STAMP)

test-min: $(MIN_STAMP)
	COURSE_QUICK=1 COURSE_CONSTRAINTS=build/constraints-min.txt $(MIN_VENV)/bin/python -m pytest $(PYTEST_ARGS)

# CPU profiles (course_utils/kit/cpu_profiles.py): the same tests as if this machine had a laptop-class CPU.
test-avx2: setup
	$(BIN)/python -m course_utils cpu --profile avx2 -- $(MAKE) --no-print-directory test PYTEST_ARGS="$(PYTEST_ARGS)"

test-haswell: setup
	$(BIN)/python -m course_utils cpu --profile haswell -- env COURSE_QUICK=1 $(BIN)/python -m pytest \
	    --nbval-cell-timeout=3600 tests/test_cpu_emulated.py notebooks/08_quantization.ipynb $(PYTEST_ARGS)

# The GPU check (course_utils/kit/gpu_check.py). Here: from .venv, which has every package. On a lent GPU
# machine with its own Python and torch: carry build/gpu-bundle (make gpu-bundle) and run tools/gpu_check.sh.
gpu-check: setup
	PY=$(BIN)/python BUNDLE=none bash tools/gpu_check.sh $(GPU_CHECK_ARGS)

gpu-bundle: setup
	$(BIN)/python -m course_utils.kit.gpu_bundle build

# ExecuTorch, notebook 06's optional extra, tested: its own environment with the pinned pair (constraints.txt
# plus constraints-executorch.txt, which pins executorch and only the packages it adds), so .venv stays as it is.
# `make executorch` also installs a kernel for it ("PyTorch 2 course + ExecuTorch") for the current user.
# Not ".venv-executorch": torch 2.14's export turns off the shape guards of ExportedProgram.module() when any
# caller's file path contains "executorch" (torch/export/_unlift.py, _ok_to_generate_guards_fn), and every
# torch file of a venv with that name does, so notebook 06's shape checks would change.
ET_VENV     ?= .venv-et
ET_STAMP    := $(ET_VENV)/.course-installed
ET_KERNEL   := pytorch2-course-executorch

.PHONY: executorch test-executorch test-next

$(ET_STAMP): pyproject.toml constraints.txt constraints-executorch.txt
	@$(PYTHON) tools/check_python.py
	$(PYTHON) -m venv $(ET_VENV) || { rm -rf $(ET_VENV); exit 1; }
	$(ET_VENV)/bin/python $(PIP_INSTALL) --upgrade "pip>=24"
	$(ET_VENV)/bin/python $(PIP_INSTALL) -c constraints.txt -c constraints-executorch.txt -e ".[dev,executorch]"
	$(ET_VENV)/bin/python tools/compile_bytecode.py
	@touch $(ET_STAMP)
	@echo "ExecuTorch environment ready in $(ET_VENV)."

executorch: $(ET_STAMP)
	$(ET_VENV)/bin/python -c "from ipykernel.kernelspec import install; from course_utils.kit import lab; \
	    print('kernel $(ET_KERNEL) ->', install(user=True, kernel_name='$(ET_KERNEL)', \
	    display_name='PyTorch 2 course + ExecuTorch', env=lab.kernel_env()))"

test-executorch: $(ET_STAMP)
	COURSE_QUICK=1 $(ET_VENV)/bin/python -m pytest tests/test_executorch.py notebooks/06_export.ipynb $(PYTEST_ARGS)

# The next release: tools/next_release.py asks the registry (PyPI's JSON API, NEXT_INDEX) for the newest torch,
# torchvision and torchaudio inside pyproject.toml's ranges, says what it picked and why it skipped newer ones,
# and writes build/constraints-next.txt (constraints.txt with that family); the environment is rebuilt only
# when that file changes. Then the whole suite, in quick mode, as `make test` runs it.
NEXT_VENV   ?= build/venv-next
NEXT_INDEX  ?= https://pypi.org/pypi
NEXT_PINS   := build/constraints-next.txt
NEXT_STAMP  := $(NEXT_VENV)/.course-installed

test-next:
	$(PYTHON) tools/next_release.py --index $(NEXT_INDEX) --out $(NEXT_PINS) --report build/next-release.json
	@$(MAKE) --no-print-directory $(NEXT_STAMP)
	COURSE_QUICK=1 COURSE_CONSTRAINTS=$(NEXT_PINS) $(NEXT_VENV)/bin/python -m pytest -n $(WORKERS) --dist loadfile $(PYTEST_ARGS)

$(NEXT_STAMP): $(NEXT_PINS) pyproject.toml
	$(PYTHON) -m venv $(NEXT_VENV) || { rm -rf $(NEXT_VENV); exit 1; }
	$(NEXT_VENV)/bin/python $(PIP_INSTALL) --upgrade "pip>=24"
	$(NEXT_VENV)/bin/python $(PIP_INSTALL) -c $(NEXT_PINS) -e ".[dev]"
	$(NEXT_VENV)/bin/python tools/compile_bytecode.py
	@touch $(NEXT_STAMP)

# Needs the network once; then copy the folder (manifest.json inside) to each laptop.
wheelhouse:
	$(PYTHON) -m course_utils.kit.wheelhouse build --dest $(or $(WHEELHOUSE),build/wheelhouse)

wheelhouse-install:
	COURSE_RESULTS=$${COURSE_RESULTS:-build/wheelhouse-results.jsonl} $(PYTHON) -m course_utils.kit.wheelhouse \
	    install $(or $(WHEELHOUSE),build/wheelhouse) --venv build/wheelhouse-venv --netns

constraints: setup
	$(BIN)/python tools/freeze_constraints.py > constraints.txt.new && mv constraints.txt.new constraints.txt

# The course site (site/README.md): a static HTML book of the notebooks with their stored outputs,
# built offline by tools/build_site.py with tools of its own in build/venv-site (pinned in
# site/requirements.txt; .venv is untouched). `make test-site` reads every page in headless Chromium.
SITE_VENV   ?= build/venv-site
SITE_STAMP  := $(SITE_VENV)/.site-installed

$(SITE_STAMP): site/requirements.txt
	rm -rf $(SITE_VENV)
	$(PYTHON) -m venv $(SITE_VENV)
	$(SITE_VENV)/bin/python $(PIP_INSTALL) -r site/requirements.txt
	$(SITE_VENV)/bin/python tools/compile_bytecode.py
	@touch $(SITE_STAMP)

site: $(SITE_STAMP)
	$(SITE_VENV)/bin/python tools/build_site.py --out build/site

test-site: setup $(SITE_STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider tests/test_site.py $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .cache build .pytest_cache *.egg-info
