# Two commands do everything on a fresh machine:  make demo  (main job)  and  make test.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test check lint demo info bench device-check minilm smollm clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,ray]'
	touch $(STAMP)

install: $(STAMP)

# two workers, one per core of the 2-core target: the suite keeps every core busy, and a
# worker more only compiles again what the others already hold in memory, so a cold run takes
# longer with 3 or 4 than with 2
test: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -q --durations=15

# the quick tier before each commit (exactness, configs, refusals; target: 3 minutes cold)
check: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -q -m quick

lint: $(STAMP)
	$(BIN)/ruff check attnjax tests experiments

demo: $(STAMP)
	$(BIN)/attnjax sweep experiments/demo.py --workdir runs/demo-sweep --launcher vmap
	$(BIN)/attnjax report runs/demo-sweep

# a real pretrained model (sentence-transformers/all-MiniLM-L6-v2) as the run runs/minilm
minilm: $(STAMP)
	$(BIN)/python scripts/get_minilm.py --cache .cache --workdir runs/minilm

# a real pretrained decoder (SmolLM2-135M-Instruct, GGUF Q4_1) as the run runs/smollm
smollm: $(STAMP)
	$(BIN)/python scripts/get_smollm.py --cache .cache --workdir runs/smollm

# what an accelerator adds (kernel parity with cudnn, bf16 MFU, decoding, batched patching);
# on a CPU the same script at a small size
device-check: $(STAMP)
	$(BIN)/python scripts/device_check.py --out benchmarks/results/device-check.json

info: $(STAMP)
	$(BIN)/attnjax info

# TORCH_PYTHON=PYTHON (an interpreter with torch and transformers): bench attention also times
# PyTorch's fused SDPA, and bench warm transformers generating from the GPT-2 fixture's export
bench: $(STAMP)
	$(BIN)/attnjax bench attention $(if $(TORCH_PYTHON),--python $(TORCH_PYTHON)) \
		--out benchmarks/results/attention.json
	$(BIN)/attnjax bench train --out benchmarks/results/train.json
	$(BIN)/attnjax bench sweep --out benchmarks/results/sweep.json
	$(BIN)/attnjax bench memory --out benchmarks/results/memory.json
	for kernel in reference chunked; do $(BIN)/attnjax bench memory data.length=8192 \
		model.max_length=8192 train.batch_size=1 model.attention.kernel=$$kernel \
		--out benchmarks/results/memory-8192-$$kernel.json; done
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(BIN)/attnjax bench mesh \
		--out benchmarks/results/mesh.json
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(BIN)/attnjax bench mesh \
		model.d_model=1024 model.num_layers=26 data.length=128 model.max_length=128 \
		model.remat=true --meshes fsdp=8 --steps 2 --out benchmarks/results/mesh-large.json
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(BIN)/attnjax bench context \
		--out benchmarks/results/context.json
	$(BIN)/attnjax bench generate --out benchmarks/results/generate.json
	$(BIN)/attnjax bench generate experiments/seq2seq.py model.d_model=128 \
		--out benchmarks/results/translate.json
	$(BIN)/attnjax bench eval experiments/baseline.py --out benchmarks/results/eval.json
	$(BIN)/attnjax bench eval experiments/baseline.py model.d_model=256 model.max_length=256 \
		data.length=256 --out benchmarks/results/eval-d256-T256.json
	$(BIN)/attnjax bench patch experiments/baseline.py --out benchmarks/results/patch.json
	$(BIN)/attnjax bench startup --out benchmarks/results/startup.json
	rm -rf runs/bench-warm runs/bench-warm-gpt2
	$(BIN)/attnjax train experiments/baseline.py train.steps=10 train.log_every=10 \
		train.eval_every=10 train.checkpoint_every=10 --workdir runs/bench-warm --no-progress
	$(BIN)/attnjax bench warm runs/bench-warm --out benchmarks/results/warm.json
	$(BIN)/attnjax import tests/data/hf/gpt2 --workdir runs/bench-warm-gpt2
	$(BIN)/attnjax bench warm runs/bench-warm-gpt2 $(if $(TORCH_PYTHON),--python $(TORCH_PYTHON)) \
		--out benchmarks/results/warm-gpt2.json
	$(BIN)/attnjax bench report --out docs/PERFORMANCE.md

clean:
	rm -rf $(VENV) build *.egg-info
