# Two set-up commands work on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# the torch release the suite runs on (pyproject.toml's extra accepts a range)
TORCH_VERSION ?= 2.13.0

.PHONY: demo demo-keras primitives test test-notorch lint typecheck unit soak fuzz clean

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

test: lint typecheck unit test-notorch

# TensorFlow and Keras users install no torch: in a venv of its own with TF, Keras and
# JAX but no torch, unison.tensorflow and unison.keras import, and the TF2 custom loop
# and the Keras example (tensorflow and jax backends) train under `unison run -np 2`.
NOTORCH := .venv-notorch
NOTORCH_STAMP := $(NOTORCH)/.installed
$(NOTORCH_STAMP): pyproject.toml
	$(PY) -m venv $(NOTORCH)
	$(NOTORCH)/bin/pip install -q --upgrade pip
	$(NOTORCH)/bin/pip install -q numpy 'tensorflow-cpu==2.21.0' 'keras>=3.15' 'jax[cpu]' \
		scikit-learn pytest pytest-timeout
	$(NOTORCH)/bin/pip install -q --no-deps -e .
	touch $(NOTORCH_STAMP)

test-notorch: $(NOTORCH_STAMP)
	$(NOTORCH)/bin/python -c "import importlib.util as u, sys; \
		assert u.find_spec('torch') is None, 'torch is installed in $(NOTORCH)'; \
		import unison.tensorflow, unison.keras; assert 'torch' not in sys.modules"
	$(NOTORCH)/bin/unison run -np 2 $(NOTORCH)/bin/python examples/tensorflow2_digits.py
	KERAS_BACKEND=tensorflow $(NOTORCH)/bin/unison run -np 2 \
		$(NOTORCH)/bin/python examples/keras_digits.py
	KERAS_BACKEND=jax $(NOTORCH)/bin/unison run -np 2 $(NOTORCH)/bin/python examples/keras_digits.py

# 20,000 random operations at np=4, every result checked (a short form runs in `make test`).
soak: $(STAMP)
	$(BIN)/unison run -np 4 $(BIN)/python -m unison.testing.soak --ops 20000 --seed 1

# The network-facing parsers under many more generated inputs.
fuzz: $(STAMP)
	$(BIN)/python -m pytest -q tests/fuzz tests/transport/test_framing_matching.py \
		tests/store/test_store_proto.py -p no:cacheprovider --hypothesis-profile=fuzz

clean:
	rm -rf $(VENV) $(NOTORCH) .pytest_cache .mypy_cache .ruff_cache
