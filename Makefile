# The two commands of the README: `make demo` and `make test`. Each creates .venv when missing.
#
# torch is installed first, pinned: on a machine without CUDA the CPU build (from a local
# wheel directory when pip's find-links has one, else from PyTorch's CPU index); with CUDA,
# the regular build. Installing the package afterwards then finds torch==2.13.0 satisfied.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.zhnlp-installed
TORCH  := torch==2.13.0

.PHONY: demo test install clean-venv

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		echo "CUDA found: installing $(TORCH)"; \
		$(PY) -m pip install -q "$(TORCH)"; \
	else \
		echo "no CUDA: installing the CPU build of $(TORCH)"; \
		$(PY) -m pip install -q --no-index "$(TORCH)" 2>/dev/null \
		|| $(PY) -m pip install -q "$(TORCH)" --index-url https://download.pytorch.org/whl/cpu \
		     --extra-index-url https://pypi.org/simple; \
	fi
	@$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(PY) scripts/demo.py

test: $(STAMP)
	$(PY) -m pytest -q

clean-venv:
	rm -rf $(VENV)
