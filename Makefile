# make book [PROFILE=ci|cpu|paper] [DEVICE=auto|cpu|cuda|cuda:k] [JOBS=n] [CHAPTERS="05 ..."]
#                                    execute every chapter (JOBS at a time, default one per
#                                    core) and build the HTML book; with CHAPTERS, execute and
#                                    record only those (no HTML)
# make test                          the whole test suite, chapters run in the `ci` profile
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

.PHONY: book test benchmark clean

# Refuse an unknown profile before any work, installing included.
ifneq ($(words $(PROFILE)),1)
$(error PROFILE must be one word, one of: $(PROFILES))
endif
ifeq ($(filter $(PROFILE),$(PROFILES)),)
$(error Unknown PROFILE '$(PROFILE)': choose one of $(PROFILES))
endif

$(INSTALLED): requirements.txt pyproject.toml
	@test -x $(PYTHON) || $(SYSTEM_PYTHON) -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -r requirements.txt
	@touch $@

book: $(INSTALLED)
	$(PYTHON) -m toycore.book --profile $(PROFILE) $(if $(DEVICE),--device $(DEVICE)) \
		$(if $(JOBS),--jobs $(JOBS)) $(if $(CHAPTERS),--chapters $(CHAPTERS))

# One thread per process: the ci profile's models are tiny, so a second thread buys nothing
# (4.1 min against 3.7 alone), while two processes each spinning two threads on two cores
# slowed each other 3.5x; with one thread each, anything else running costs the tests nothing.
test: $(INSTALLED)
	OMP_NUM_THREADS=1 TOYCORE_PROFILE=ci $(PYTHON) -m pytest

benchmark: $(INSTALLED)
	$(PYTHON) benchmarks/tied_step.py
	$(PYTHON) benchmarks/rug_grid.py
	$(PYTHON) benchmarks/dask_sweep.py

clean:
	rm -rf _build
