# make book [PROFILE=ci|cpu|paper]   execute every chapter and build the HTML book
# make test                          the whole test suite, chapters run in the `ci` profile
PROFILE ?= cpu
PROFILES := ci cpu paper
VENV ?= .venv
PYTHON := $(VENV)/bin/python
SYSTEM_PYTHON ?= python3
# The installed marker is rebuilt whenever the pins or the package metadata change.
INSTALLED := $(VENV)/.installed

.PHONY: book test clean

$(INSTALLED): requirements.txt pyproject.toml
	@test -x $(PYTHON) || $(SYSTEM_PYTHON) -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -r requirements.txt
	@touch $@

book: $(INSTALLED)
	@case " $(PROFILES) " in *" $(PROFILE) "*) ;; \
	  *) echo "Unknown PROFILE '$(PROFILE)': choose one of $(PROFILES)" >&2; exit 2;; esac
	$(PYTHON) -m toycore.book --profile $(PROFILE)

test: $(INSTALLED)
	TOYCORE_PROFILE=ci $(PYTHON) -m pytest

clean:
	rm -rf _build
