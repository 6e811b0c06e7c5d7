# fusecut: `make run` starts the service, `make test` runs the whole suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: run test lint venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# Never replace a torch the environment already has (a user's CUDA build); without a GPU
	@# take the small CPU build.
	$(PY) -c "import torch" 2>/dev/null || { \
	  if command -v nvidia-smi >/dev/null 2>&1; then $(PY) -m pip install -q torch; \
	  else $(PY) -m pip install -q torch==2.13.0; fi; }
	@# gpu: NVRTC, which the tests compile every generated kernel with (no GPU needed)
	$(PY) -m pip install -q -e '.[dev,gpu,thunder,postgres,ray]'
	@# An editable install does not run setup.py's build step that ships this .pth in the wheel.
	cp src/fusecut/thunder/fusecut-thunder.pth "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/"
	rm -f $(VENV)/.installed-*
	touch $@

run: venv
	$(VENV)/bin/fusecut serve --host $(HOST) --port $(PORT)

test: venv
	$(PY) -m ruff check .
	$(PY) -m pytest -q

lint: venv
	$(PY) -m ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
