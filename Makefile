# The two commands of the README: `make demo` and `make test`. Each creates .venv when missing.
#
# torch is installed first, pinned (scripts/install_torch.sh): on a machine without CUDA the
# CPU build, with CUDA the regular one. Installing the package afterwards then finds
# torch==2.13.0 satisfied and pulls nothing bigger.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.zhnlp-installed

.PHONY: demo test install clean-venv

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@scripts/install_torch.sh $(PY) 2.13.0
	@$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(PY) scripts/demo.py

test: $(STAMP)
	$(PY) -m pytest -q

clean-venv:
	rm -rf $(VENV)
