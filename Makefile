# make book [PROFILE=ci|cpu|paper] [DEVICE=auto|cpu|cuda|cuda:k] [JOBS=n] [CHAPTERS="05 ..."]
#                                    execute every chapter (JOBS at a time, default one per
#                                    core) and build the HTML book; with CHAPTERS, execute and
#                                    record only those (no HTML); SECTIONS=1-3,5 with one
#                                    chapter executes only those sections (a part of its record)
# make paper-gpu BUDGET=560 OUT=dir  on a lent GPU machine (no network): the paper profile's
#                                    parts with no current record, most valuable first, within
#                                    BUDGET seconds, recorded part by part and packed into OUT
#                                    (two files); installs the wheels in .whl first, if any;
#                                    PARTS="05_persian_rug:12 ..." runs those parts instead;
#                                    JOBS=3 trains each part's shards in 3 processes that
#                                    share the GPU (not yet tried on one)
# make wheels-gpu                    download those wheels into .whl (here, where PyPI is)
# make gpu-checks OUT=dir            on a lent GPU machine, after paper-gpu: the unit tests on
#                                    the device and chapter 5's grid step, logged into OUT
# make test                          the whole test suite, chapters run in the `ci` profile
#                                    (installs Debian's Chromium first if missing)
# make check                         unit tests and style only (the inner loop)
# make lab                           open the chapters in JupyterLab (installed on first use)
# make clean-cache                   remove cached results that no current code can use
# make benchmark                     chapter 3's closed-form step against plain autograd,
#                                    chapter 5's batched grid against a plain loop, and a
#                                    sharded sweep on a local Dask cluster against in-process
PROFILE ?= cpu
PROFILES := ci cpu paper
VENV ?= .venv
PYTHON := $(VENV)/bin/python
SYSTEM_PYTHON ?= python3
# The installed marker is rebuilt whenever the pins or the package metadata change.
INSTALLED := $(VENV)/.installed

.PHONY: book test check lab benchmark clean clean-cache test-system paper-gpu wheels-gpu gpu-checks

# Refuse an unknown profile before any work, installing included.
ifneq ($(words $(PROFILE)),1)
$(error PROFILE must be one word, one of: $(PROFILES))
endif
ifeq ($(filter $(PROFILE),$(PROFILES)),)
$(error Unknown PROFILE '$(PROFILE)': choose one of $(PROFILES))
endif

# pip would compile every module it installs, up front (half a minute on 2 cores, most of it
# torch's); Python compiles only what a process imports, once, when it may write bytecode. So
# install without compiling, and let make's commands write bytecode even where the machine's
# environment says not to (PYTHONDONTWRITEBYTECODE; __pycache__ is ignored by git).
export PYTHONDONTWRITEBYTECODE :=

$(INSTALLED): requirements.txt pyproject.toml
	@test -x $(PYTHON) || $(SYSTEM_PYTHON) -m venv $(VENV) || { echo "could not create $(VENV):" \
		"install Python's venv module (Debian: apt-get install python3-venv)" >&2; exit 1; }
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet --no-compile -r requirements.txt
	@touch $@

book: $(INSTALLED)
	$(PYTHON) -m toycore.book --profile $(PROFILE) $(if $(DEVICE),--device $(DEVICE)) \
		$(if $(JOBS),--jobs $(JOBS)) $(if $(CHAPTERS),--chapters $(CHAPTERS)) \
		$(if $(SECTIONS),--sections $(SECTIONS))

# The lent GPU machine's own Python holds torch; the book's execution stack travels as wheels,
# installed beside it, and toycore is read from this tree.
WHEELS := .whl
GPU_SITE := /tmp/toycore-site
# tf32: chapter 5's products on the tensor cores (no verdict of its cpu profile moved with them,
# benchmarks/tf32_verdicts.py); the other chapters run in float32 (toycore.book.paper)
MATMUL ?= tf32
INSTALL_WHEELS := if [ -d $(WHEELS) ]; then python3 -m pip install --quiet --no-index --no-deps \
	--no-compile --no-cache-dir --upgrade --target $(GPU_SITE) $(WHEELS)/*.whl; fi
GPU_ENV := PYTHONPATH=$(GPU_SITE):$(CURDIR) PYTHONUNBUFFERED=1
paper-gpu:
	@test -n "$(BUDGET)" -a -n "$(OUT)" || { echo "make paper-gpu needs BUDGET=<seconds> OUT=<folder>" >&2; exit 1; }
	@$(INSTALL_WHEELS)
	$(GPU_ENV) TOYCORE_MATMUL=$(MATMUL) python3 -m toycore.book.paper --budget $(BUDGET) --out $(OUT) \
		$(if $(DEVICE),--device $(DEVICE)) $(if $(PARTS),--parts "$(PARTS)") \
		$(if $(JOBS),--jobs $(JOBS))

# The unit tests that run on the device (data, models, training, the chapters' experiments, the
# result cache), without tests/conftest.py, whose browser and book-build fixtures need
# Playwright, which the lent machine lacks (so the one test that reads the built book is left
# out), in float32, then chapter 5's grid step part by part in MATMUL's precision; each into a
# log in OUT (about 3 minutes).
GPU_TESTS := tests/test_data_models_train.py tests/test_persian_rug.py \
	tests/test_polysemantic.py tests/test_hidden_noise.py tests/test_relu.py \
	tests/test_theory_linear.py tests/test_claims_profiles_cache.py tests/test_scale.py
gpu-checks:
	@test -n "$(OUT)" || { echo "make gpu-checks needs OUT=<folder>" >&2; exit 1; }
	@$(INSTALL_WHEELS)
	mkdir -p $(OUT)
	-$(GPU_ENV) TOYCORE_PROFILE=ci TOYCORE_MATMUL=float32 python3 -m pytest -q --noconftest -o addopts="" \
		-p no:cacheprovider -p no:benchmark -n 14 -k "not dask" $(GPU_TESTS) --deselect \
		tests/test_scale.py::test_the_intro_shows_the_paper_verdicts_or_says_none_was_recorded \
		> $(OUT)/gpu-tests.log 2>&1; tail -3 $(OUT)/gpu-tests.log
	$(GPU_ENV) TOYCORE_MATMUL=$(MATMUL) python3 benchmarks/grid_step.py --features 512 2048 --models 21 \
		> $(OUT)/grid-step.log 2>&1; grep -E "^ns|step:|as a reduction|8 at a time" $(OUT)/grid-step.log

wheels-gpu: $(INSTALLED)
	rm -rf $(WHEELS)
	$(PYTHON) -m toycore.book.paper --wheels $(WHEELS)

# Two test processes (TEST_PROCESSES), each file in one of them (--dist loadfile keeps a
# chapter's cells together), sharing one result cache: each chapter is computed once per run.
# Files go out in the order conftest.py puts them, the longest first (--no-loadscope-reorder;
# xdist would send the files with the most tests first): the Binder test, few tests but minutes
# long, starts at once, beside the book build, and short files fill the end.
# One torch thread per process: the ci profile's models are tiny, so a second thread buys
# nothing, while two processes each spinning two threads on two cores slowed each other 3.5x.
TEST_PROCESSES ?= 2
PYTEST := OMP_NUM_THREADS=1 TOYCORE_PROFILE=ci $(PYTHON) -m pytest -n $(TEST_PROCESSES) --dist loadfile --no-loadscope-reorder
test: test-system $(INSTALLED)
	$(PYTEST)

# The inner loop: unit tests and style, without executing chapters or installing environments.
check: $(INSTALLED)
	$(PYTEST) -m "not book" tests

# What the tests need from Debian: Chromium, which the browser tests drive (never a browser that
# Playwright downloads). Installed when missing and the machine allows it (root, apt-get);
# otherwise make test stops, before any test runs, with one line saying what to install.
define debian_package
	@if ! command -v $(1) > /dev/null; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get > /dev/null; then \
			echo "installing Debian's $(2) ($(3))"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(2) > /dev/null; \
		else \
			echo "make $(subst -system,,$@) needs $(1) ($(3)): run 'sudo apt-get install $(2)'" >&2; \
			$(4); \
		fi; \
	fi
endef

# TOYCORE_CHROMIUM names another Chromium or Chrome for the browser tests.
test-system:
	$(if $(TOYCORE_CHROMIUM),,$(call debian_package,chromium,chromium,the browser tests drive it,exit 1))

# JupyterLab is pinned here, not in requirements.txt: the book does not need it (the Binder test
# installs this pin too).
JUPYTERLAB := jupyterlab==4.6.4
lab: $(INSTALLED)
	$(PYTHON) -m pip install --quiet --no-compile $(JUPYTERLAB)
	$(VENV)/bin/jupyter lab chapters $(if $(filter 0,$(shell id -u)),--allow-root)

benchmark: $(INSTALLED)
	$(PYTHON) benchmarks/tied_step.py
	$(PYTHON) benchmarks/allocator.py
	$(PYTHON) benchmarks/rug_grid.py
	$(PYTHON) benchmarks/dask_sweep.py

clean:
	rm -rf _build

# Remove the result cache's folders that no current code, device type or library versions use.
# (Not `-m toycore.cache`: the package imports toycore.cache first, and runpy warns of that.)
clean-cache: $(INSTALLED)
	$(PYTHON) -c "import sys; from toycore import cache; sys.exit(cache.main(['--prune']))"
