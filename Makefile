# Two set-up commands work on a fresh machine: `make demo` and `make test`.
# `make demo` installs only what the demo needs (unison, torch, scikit-learn);
# `make test` adds the other frameworks, Ray, Open MPI and the development tools.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO_STAMP := $(VENV)/.demo-installed
STAMP := $(VENV)/.installed
# the torch release the suite runs on (pyproject.toml's extras accept a range)
TORCH_VERSION ?= 2.13.0
# the TensorFlow series the suite runs on (tf_keras must match it)
TF_SERIES ?= 2.21
# where torch comes from besides the package index, e.g. TORCH_INDEX=https://download.pytorch.org/whl/cpu
# for the CPU-only build (the index's Linux torch brings CUDA libraries)
TORCH_INDEX ?=
PIP := $(BIN)/python -m pip install --progress-bar on

.PHONY: demo demo-keras primitives test test-notorch lint typecheck unit soak faults fuzz torch-suite clean

$(BIN)/python:
	@$(PY) -m venv $(VENV) || { rm -rf $(VENV); echo "make: '$(PY) -m venv' failed;" \
		"on Debian/Ubuntu: sudo apt install python3-venv"; exit 1; }
	$(BIN)/python -m pip install --upgrade pip

$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	@echo "make: installing unison, torch $(TORCH_VERSION) and scikit-learn into $(VENV)"
	$(PIP) 'torch==$(TORCH_VERSION)' $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	$(PIP) -e '.[demo]'
	touch $@

$(STAMP): $(DEMO_STAMP)
	@echo "make: installing TensorFlow, Keras, JAX, Ray, Open MPI and the test tools into $(VENV)"
	$(PIP) 'tensorflow-cpu==$(TF_SERIES).*'
	$(PIP) --no-deps 'tf_keras==$(TF_SERIES).*'  # Keras 2 for tf.keras users (needs TF's own series)
	$(PIP) -e '.[dev,examples,keras,jax,ray,mpi]'
	touch $@

# The main job: data-parallel training of a CNN on scikit-learn's digits, 2 ranks,
# through unison.torch (a Horovod script with `import unison.torch as hvd`).
demo: $(DEMO_STAMP)
	$(BIN)/unison run -np 2 $(BIN)/python examples/pytorch_digits.py

# The same job in Keras 3 through unison.keras (KERAS_BACKEND=tensorflow|torch|jax).
KERAS_BACKEND ?= tensorflow
demo-keras: $(STAMP)
	KERAS_BACKEND=$(KERAS_BACKEND) $(BIN)/unison run -np 2 $(BIN)/python examples/keras_digits.py

# Every primitive of the core API once, on 4 ranks.
primitives: $(DEMO_STAMP)
	$(BIN)/unison run -np 4 $(BIN)/python examples/primitives.py

lint: $(STAMP)
	$(BIN)/ruff check unison tests examples benchmarks
	$(BIN)/ruff format --check unison tests examples benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy unison

# The whole suite (on one host ranks use shared memory), then the collectives again
# with TCP forced: both transports must pass. Tests run TEST_WORKERS at a time
# (pytest-xdist; most of a test's time is its ranks waiting on each other); the ones that
# build network namespaces share one worker. TEST_WORKERS=0: one at a time, in-process.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadgroup
unit: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) --durations=25
	UNISON_TEST_TRANSPORT=tcp $(BIN)/python -m pytest -q $(XDIST) tests/comm

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

# PyTorch's own distributed suite (torch's DistributedTest, shipped in the wheel), CPU,
# fork start, world sizes 2 and 3, on Gloo and on "unison", two runs at a time: fails
# when a test that passes on Gloo does not pass on unison (the named exceptions are in
# unison/testing/torch_suite.py). Outcomes and logs: $(TORCH_SUITE_OUT). Then a sample
# under spawn start (each rank a fresh interpreter, as test_distributed_spawn.py runs it).
TORCH_SUITE_OUT ?= .torch-suite
torch-suite: $(STAMP)
	$(BIN)/python -m unison.testing.torch_suite compare --world-sizes 2 3 --jobs 2 \
		--keep $(TORCH_SUITE_OUT)
	$(BIN)/python -m unison.testing.torch_suite run --backend unison --world-size 2 --start spawn \
		-k '*.test_barrier' -k '*.test_all_reduce_sum'

# 20,000 random operations at np=4, every result checked (a short form runs in `make test`).
soak: $(STAMP)
	$(BIN)/unison run -np 4 $(BIN)/python -m unison.testing.soak --ops 20000 --seed 1

# The fault campaign: kill/stop/exit/mismatch on the native API, unison.torch, c10d+DDP
# and the torch and mpi engines, hostile store clients, leftovers after each case; one
# line per case, non-zero on a regression (its short part runs in `make test`).
faults: $(STAMP)
	$(BIN)/python -m unison.testing.campaign

# The network-facing parsers under many more generated inputs.
fuzz: $(STAMP)
	$(BIN)/python -m pytest -q tests/fuzz tests/transport/test_framing_matching.py \
		tests/store/test_store_proto.py -p no:cacheprovider --hypothesis-profile=fuzz

clean:
	rm -rf $(VENV) $(NOTORCH) .pytest_cache .mypy_cache .ruff_cache $(TORCH_SUITE_OUT)
