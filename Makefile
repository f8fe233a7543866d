# tierlog: everyday commands. `make demo` and `make test` work on a fresh machine (they run `setup`).
# Services (real Kafka + SeaweedFS S3 on 127.0.0.1) are managed by dev/services; see README.md.

# Every target runs Python from the project's own virtualenv (never the system interpreter, PEP 668).
# BASE_PYTHON (3.11+) only creates it; PYTHON is the interpreter inside it.
BASE_PYTHON ?= python3
VENV ?= .venv
PYTHON := $(VENV)/bin/python
PYTEST_ARGS ?=
STAMPS := .dev/stamps
# The JVM adapter is rebuilt only when its sources or the shared protocol change.
JVM_SOURCES := $(wildcard jvm/pom.xml) $(shell find jvm/src -type f 2>/dev/null) $(wildcard schemas/*.proto)

.PHONY: setup venv python-deps kafka-jars azurite jvm jvm-test dist services-up services-down services-status demo test test-soak lint bench bench-kafka

setup: python-deps kafka-jars azurite jvm

# Debian and Ubuntu ship venv without ensurepip unless python3-venv is installed: say so in one line.
venv: $(PYTHON)
$(PYTHON):
	@$(BASE_PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "make: $(BASE_PYTHON) must be Python 3.11 or newer (set BASE_PYTHON=...)" >&2; exit 1; }
	@$(BASE_PYTHON) -m venv $(VENV) || { rm -rf $(VENV); \
		echo "make: '$(BASE_PYTHON) -m venv' failed; on Debian/Ubuntu install python3-venv" >&2; exit 1; }
	$(PYTHON) -m pip install --quiet --disable-pip-version-check --upgrade pip

python-deps: $(STAMPS)/python-deps
$(STAMPS)/python-deps: $(PYTHON) pyproject.toml setup.py $(wildcard rlmm/*.c)
	$(PYTHON) -m pip install --quiet --disable-pip-version-check 'setuptools>=77' wheel
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -e '.[dev,spark]'
	@mkdir -p $(STAMPS) && touch $@

kafka-jars: $(PYTHON)
	$(PYTHON) -c 'from dev.kafka import ensure_kafka_libs; print("Kafka jars in", ensure_kafka_libs())'

# Azurite (Azure Blob Storage's emulator, from npm) for the rsm Azure backend's tests, under .dev/node.
AZURITE_VERSION ?= 3.37.0
azurite: $(STAMPS)/azurite-$(AZURITE_VERSION)
$(STAMPS)/azurite-$(AZURITE_VERSION):
	@command -v npm >/dev/null || { echo "make: npm is needed to install Azurite (install Node.js 18+)" >&2; exit 1; }
	npm install --prefix .dev/node --no-audit --no-fund --loglevel=error azurite@$(AZURITE_VERSION)
	@mkdir -p $(STAMPS) && touch $@

jvm: $(if $(wildcard jvm/pom.xml),$(STAMPS)/jvm)
$(STAMPS)/jvm: $(JVM_SOURCES)
	mvn -q -B -Dstyle.color=never -f jvm/pom.xml package -DskipTests
	@mkdir -p $(STAMPS) && touch $@

# The adapter's unit tests (JUnit 5); `make test` runs them before the Python suite.
jvm-test:
	mvn -q -B -Dstyle.color=never -f jvm/pom.xml test

# The release artifacts in dist/: the wheel (schemas, generated protocol code and the plugin jar inside, see
# setup.py) and the source tarball it can be rebuilt from. Install on a broker host:
#   python3 -m venv /opt/tierlog && /opt/tierlog/bin/pip install dist/tierlog-*.whl
dist: python-deps jvm
	rm -rf dist
	$(PYTHON) -m build --outdir dist .
	@ls -l dist

services-up: python-deps
	$(PYTHON) dev/services up

services-down: python-deps
	$(PYTHON) dev/services down

services-status: python-deps
	$(PYTHON) dev/services status

# The demo starts (and stops) its own Kafka, configured with the tierlog plugins, and its own S3.
demo: setup
	$(PYTHON) -m dev.demo

# Any failed test fails the target, and so does a run that collects no test (pytest status 5).
# Two workers: most tests wait on a broker, S3 or a JVM, so two share the machine's two cores well.
PYTEST_WORKERS ?= 2
test: setup jvm-test
	@status=0; $(PYTHON) -m pytest -q -rfEs --durations=20 -n $(PYTEST_WORKERS) --dist loadgroup -m 'not soak' \
		$(PYTEST_ARGS) || status=$$?; \
	if [ $$status = 5 ]; then echo "make test: pytest collected no tests" >&2; fi; \
	exit $$status

# Long end-to-end scenarios (a 3-broker roll from Kafka's manager to tierlog): minutes each, outside `make test`.
test-soak: setup
	$(PYTHON) -m pytest -q -rfEs -m soak

# Test directories are checked one by one: each has its own conftest.py, which mypy would
# otherwise see as one module defined twice.
lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m mypy rlmm rsm tierlog dev dev/services $(wildcard bench/*.py)
	$(PYTHON) -m mypy $(wildcard tests/*.py)
	@set -e; for dir in tests/*/; do \
		case "$$dir" in *__pycache__*) continue;; esac; \
		[ -n "$$(find "$$dir" -name '*.py' -print -quit)" ] || continue; \
		echo "mypy $$dir"; $(PYTHON) -m mypy "$$dir"; \
	done

# Each benchmark prints one JSON document; they run against the shared services.
bench: setup services-up
	@set -e; found=0; for script in bench/*.py; do \
		[ -f "$$script" ] || continue; found=1; \
		echo "== $$script" >&2; $(PYTHON) "$$script"; \
	done; [ $$found = 1 ] || echo "no benchmarks in bench/" >&2

# tierlog's metadata manager against Kafka's own TopicBasedRemoteLogMetadataManager on a Kafka it starts
# (quick: 40k live segments hosting every partition, a few minutes; BENCH_ARGS=--full for 1M hosting 10% and all).
# JSON on stdout, the ratio table on stderr.
bench-kafka: setup services-up
	$(PYTHON) bench/rlmm_vs_kafka.py $(BENCH_ARGS)
