# Two set-up commands work on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# the torch release the suite runs on (pyproject.toml's extra accepts a range)
TORCH_VERSION ?= 2.13.0

.PHONY: demo demo-keras primitives test lint typecheck unit soak fuzz torch-suite clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q 'torch==$(TORCH_VERSION)'
	$(BIN)/pip install -q -e '.[dev,torch,examples,tensorflow,jax,ray]'
	touch $(STAMP)

# The main job: data-parallel training of a CNN on scikit-learn's digits, 2 ranks,
# through unison.torch (a Horovod script with `import unison.torch as hvd`).
demo: $(STAMP)
	$(BIN)/unison run -np 2 $(BIN)/python examples/pytorch_digits.py

# The same job in Keras 3 through unison.keras (KERAS_BACKEND=tensorflow|torch|jax).
KERAS_BACKEND ?= tensorflow
demo-keras: $(STAMP)
	KERAS_BACKEND=$(KERAS_BACKEND) $(BIN)/unison run -np 2 $(BIN)/python examples/keras_digits.py

# Every primitive of the core API once, on 4 ranks.
primitives: $(STAMP)
	$(BIN)/unison run -np 4 $(BIN)/python examples/primitives.py

lint: $(STAMP)
	$(BIN)/ruff check unison tests examples
	$(BIN)/ruff format --check unison tests examples

typecheck: $(STAMP)
	$(BIN)/mypy unison

# The whole suite (on one host ranks use shared memory), then the collectives again
# with TCP forced: both transports must pass.
unit: $(STAMP)
	$(BIN)/python -m pytest -q
	UNISON_TEST_TRANSPORT=tcp $(BIN)/python -m pytest -q tests/comm

test: lint typecheck unit

# PyTorch's own distributed suite (torch's DistributedTest, shipped in the wheel), CPU,
# fork start, world sizes 2 and 3, on Gloo and on "unison": fails when a test that
# passes on Gloo does not pass on unison (the named exceptions are in
# unison/testing/torch_suite.py). Outcomes and logs: $(TORCH_SUITE_OUT).
TORCH_SUITE_OUT ?= .torch-suite
torch-suite: $(STAMP)
	$(BIN)/python -m unison.testing.torch_suite compare --world-sizes 2 3 --keep $(TORCH_SUITE_OUT)

# 20,000 random operations at np=4, every result checked (a short form runs in `make test`).
soak: $(STAMP)
	$(BIN)/unison run -np 4 $(BIN)/python -m unison.testing.soak --ops 20000 --seed 1

# The network-facing parsers under many more generated inputs.
fuzz: $(STAMP)
	$(BIN)/python -m pytest -q tests/fuzz tests/transport/test_framing_matching.py \
		tests/store/test_store_proto.py -p no:cacheprovider --hypothesis-profile=fuzz

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache $(TORCH_SUITE_OUT)
