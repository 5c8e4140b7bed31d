# Two set-up commands work on a fresh machine: `make demo` and `make test`.
# Both create .venv if it is missing and install the package with pinned dependencies.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
LINT_STAMP := $(VENV)/.lint-installed
DOCS_STAMP := $(VENV)/.docs-installed
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: test test-slow test-heavy test-bench test-compat lint docs docs-check demo bench bench-tf-keras bench-peers fuzz fuzz-engine check-java venv clean

venv: $(STAMP)

$(STAMP): setup.cfg pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@# the base install has no PySpark and no TensorFlow: the extras bring a full environment
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test,dask,spark,connect,tensorflow-cpu]'
	@# keras-hub needs tensorflow-text, and tf-keras (the legacy Keras the tf-keras leg of
	@# test-compat runs with TF_USE_LEGACY_KERAS=1) `tensorflow`: a second TensorFlow beside
	@# tensorflow-cpu, so all three without dependencies; keras-hub's others are in the test extra
	$(PY) -m pip install --quiet -c constraints.txt --no-deps keras-hub tensorflow-text tf-keras
	@touch $(STAMP)

check-java:
	@command -v java >/dev/null 2>&1 || { echo "error: Java 17+ is required by PySpark 4 (install openjdk-17-jre-headless and put java on PATH)" >&2; exit 1; }
	@v=$$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1); \
	  if [ -z "$$v" ] || [ "$$v" -lt 17 ]; then echo "error: Java 17+ is required by PySpark 4, found '$$v' (java -version)" >&2; exit 1; fi

# The fast path (8m44 on a clean clone here, quiet: two pytest workers, each sharing one Spark session across its modules);
# `make test-slow` runs the cases marked slow (about 30 min), `make test-heavy` those marked heavy too (not in CI), `make test-bench` the benchmark sections at tiny sizes (about 5 min, not in CI).
# Two pytest workers (pytest-xdist), a module at a time each, each with its own shared
# session: one driver leaves a core idle while it waits on its JVM and workers.
# TEST_WORKERS=0 runs it in one process. The slow set runs the same way (its modules in
# any order: each pytest worker's JVM starts with no session's settings, tests/conftest.py).
TEST_WORKERS ?= 2
test: check-java $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow and not bench" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=20 $(PYTEST_ARGS)

test-slow: check-java $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m "slow and not heavy and not bench" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=20 $(PYTEST_ARGS) || test $$? -eq 5  # 5: none selected

# The heaviest end-to-end cases (two to four minutes each here: local-cluster with payloads
# past every heap, SIGKILLed jobs resumed, fresh drivers): not in CI, whose time they would
# pass; run them before a release and after touching what they cover.
test-heavy: check-java $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m "heavy and not bench" --durations=20 $(PYTEST_ARGS) || test $$? -eq 5  # 5: none selected

test-bench: check-java $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m bench $(PYTEST_ARGS)

# Compatibility legs, reported as a matrix: PySpark 3.5 + Keras 3 (the Spark suite, in
# .venv-spark35: PySpark 3.5 laid over this venv's packages), PySpark 4.3 + tf-keras (this venv, which has tf-keras installed,
# with TF_USE_LEGACY_KERAS=1).
# One leg: make test-compat COMPAT_ARGS=spark43-tfkeras
test-compat: check-java $(STAMP)
	MAIN_VENV=$(VENV) $(PYTHON) compat/matrix.py $(COMPAT_ARGS)

# ruff over the code, mypy over the package (settings in pyproject.toml), in the full venv
# so that mypy sees the same libraries the code runs with; CI runs it before the tests.
lint: $(LINT_STAMP)
	$(PY) -m ruff check spark_keras jobs bench tests fuzz compat
	$(PY) -m mypy

$(LINT_STAMP): $(STAMP) setup.cfg constraints.txt
	$(PY) -m pip install --quiet -c constraints.txt -e '.[lint]'
	@touch $(LINT_STAMP)

# The documentation site (mkdocs.yml, pages in docs/) into site/; --strict: a broken link,
# anchor or API reference fails it (seconds). tests/test_readme.py runs the pages' blocks.
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

# Each built page opened in headless Chromium: no console error, a screenshot of the home
# page in site-check/ (Chromium: playwright's, `$(PY) -m playwright install chromium`, or
# the system's, CHROMIUM=/usr/bin/chromium)
docs-check: docs
	$(PY) -m tests.site_pages site site-check

$(DOCS_STAMP): $(STAMP) setup.cfg constraints.txt
	$(PY) -m pip install --quiet -c constraints.txt -e '.[docs]'
	@touch $(DOCS_STAMP)

demo: check-java $(STAMP)
	$(PY) jobs/demo.py

bench: check-java $(STAMP)
	$(PY) -m bench --write $(BENCH_ARGS)

# The payload rebuild benchmark under legacy tf-keras, written to docs/benchmarks-tf-keras.md.
bench-tf-keras: check-java $(STAMP)
	TF_USE_LEGACY_KERAS=1 $(PY) -m bench --only payload --write $(BENCH_ARGS)

# spark-keras against Ray Data and Daft on a folder of PNG files (bench/peers_bench.py) and on a
# Parquet file of strings (bench/peers_text.py); not in `make test`. PEERS_SECTIONS picks them
# (make bench-peers PEERS_SECTIONS=peers_text). Ray goes into this venv (the `peers` extra);
# Daft 0.7 needs pyarrow < 26, so it gets a venv of its own, .venv-daft, with TensorFlow and
# Pillow: the bench runs it there.
DAFT_VENV ?= .venv-daft
DAFT_STAMP := $(DAFT_VENV)/.installed
PEERS_SECTIONS ?= peers_bench peers_text

bench-peers: check-java $(STAMP) $(DAFT_STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[peers]'
	for section in $(PEERS_SECTIONS); do \
		DAFT_PYTHON=$(abspath $(DAFT_VENV))/bin/python $(PY) -m bench.$$section $(BENCH_ARGS) || exit 1; done

$(DAFT_STAMP):
	@test -x $(DAFT_VENV)/bin/python || $(PYTHON) -m venv $(DAFT_VENV)
	$(DAFT_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(DAFT_VENV)/bin/python -m pip install --quiet 'daft==0.7.26' 'tensorflow-cpu==2.21.0' 'keras==3.15.1' 'pillow==13.0.0' 'pyarrow<26'
	@touch $(DAFT_STAMP)

# Coverage-guided fuzzing of the payload reader (atheris); FUZZ_SECONDS=300 by default.
fuzz: $(STAMP)
	$(PY) -m pip install --quiet atheris==3.0.0
	FUZZ_SECONDS=$${FUZZ_SECONDS:-300} $(PY) fuzz/atheris_payload.py

# The scoring engine against its differential oracle on generated cases (tests/differential):
# rounds of random cases, a fresh seed each, until FUZZ_SECONDS (600 by default) have passed.
# A failure prints its shrunk case and seed: FUZZ_SEED=<seed> make fuzz-engine reruns that
# round; FUZZ_OPEN=1 also draws the defects found and not fixed yet (strategies.OPEN_DEFECTS).
fuzz-engine: $(STAMP)
	FUZZ_SECONDS=$${FUZZ_SECONDS:-600} $(PY) -m pytest -q -p no:cacheprovider -p tests.differential.profiles \
	  --hypothesis-profile=fuzz -o timeout=0 tests/differential/test_generated.py::test_fuzz_the_engine $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .venv-spark35 .venv-tfkeras .venv-daft build dist *.egg-info .pytest_cache .hypothesis demo-out bench-out site site-check
