# fusecut: `make run` starts the service, `make test` runs the whole suite (about 40 minutes on
# 2 cores), `make test-quick` a subset that takes under 5 (4 on 2 busy cores, 2026-11-28).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SUM := $(shell cksum pyproject.toml | cut -d' ' -f1)
STAMP := $(VENV)/.installed-$(SUM)
# what `make run` needs alone: fusecut and its own dependencies (no test tools, NVRTC, Thunder,
# PostgreSQL driver or Ray); a full install (STAMP) has it too
SERVE_STAMP := $(VENV)/.serving-$(SUM)
HOST ?= 127.0.0.1
PORT ?= 8000
# the quick subset: the planner, the wire format, the docs and architecture checks, the engine,
# the environment, the CLI, the service served for real, its settings (no GPU, no PostgreSQL
# server, no Thunder)
QUICK := tests/optimizer tests/wire tests/test_architecture.py tests/test_docs.py \
	tests/test_engine.py tests/test_environment.py \
	tests/sdk/test_cli.py tests/service/test_service.py tests/service/test_settings.py \
	tests/service/test_cache_passwords.py

.PHONY: run test test-quick lint venv serve-venv clean

venv: $(STAMP)

serve-venv: $(if $(wildcard $(STAMP)),$(STAMP),$(SERVE_STAMP))

# Never replace a torch the environment already has (a user's CUDA build); without a GPU take
# the small CPU build.
define TORCH
$(PY) -c "import torch" 2>/dev/null || { \
  if command -v nvidia-smi >/dev/null 2>&1; then $(PY) -m pip install $(1) torch; \
  else $(PY) -m pip install $(1) torch==2.13.0; fi; }
endef

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(call TORCH,-q)
	@# gpu: NVRTC, which the tests compile every generated kernel with (no GPU needed)
	$(PY) -m pip install -q -e '.[dev,gpu,thunder,postgres,ray]'
	@# An editable install does not run setup.py's build step that ships this .pth in the wheel.
	cp clients/thunder/fusecut-thunder.pth "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/"
	rm -f $(VENV)/.installed-*
	touch $@

$(SERVE_STAMP): pyproject.toml
	@echo "make run: installing fusecut and what serving needs into $(VENV): about 1.2 GB with"
	@echo "  torch's CPU build (0.75 GB of it), OR-Tools, FastAPI and uvicorn. make test adds the"
	@echo "  test tools, NVRTC, Thunder, transformers, the PostgreSQL driver and Ray (about 1 GB more)."
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(call TORCH,--progress-bar on)
	$(PY) -m pip install --progress-bar on -e .
	rm -f $(VENV)/.serving-*
	touch $@

run: serve-venv
	$(VENV)/bin/fusecut serve --host $(HOST) --port $(PORT)

test: venv
	$(PY) -m ruff check .
	$(PY) -m pytest -q

test-quick: venv
	$(PY) -m ruff check .
	$(PY) -m pytest -q -m "not slow and not gpu" $(QUICK)

lint: venv
	$(PY) -m ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
