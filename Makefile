# The single entry point. `make test` on a fresh Debian machine with Python 3.11 installs what it needs
# (Debian packages, a project venv, the native build) and runs the whole suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install build broker test quicktest test-native test-pure test-debug lint bench proto clean

$(STAMP): pyproject.toml setup.py
	./scripts/system-deps.sh
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,bench,spark]'
	# PySpark finds data sources with pkgutil.iter_modules, which does not see modules of an editable
	# install (an import hook): put spark/ on the venv's path so that format("danube") resolves here too.
	echo "$(CURDIR)/spark" > "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/danube-fast-spark-dev.pth"
	touch $(STAMP)

install: $(STAMP) build

# Rebuild the extensions in place whenever a .pyx/.pxd/.h changed (pip's editable build does it once).
build: $(STAMP)
	$(BIN)/python setup.py -q build_ext --inplace

# The README's first command: the broker in standalone mode (embedded metadata store and WALs under
# DATA_DIR), on Danube's default ports, in the foreground until Ctrl-C or SIGTERM.
DATA_DIR ?= ./danube-data
broker: install
	$(BIN)/danube-fast broker --mode standalone --data-dir $(DATA_DIR) --broker-addr 127.0.0.1:6650 \
		--admin-addr 127.0.0.1:50051 --prom-exporter 127.0.0.1:9040

# Everything on the native core, then again on the pure-Python twins the tests that reach the core
# through the selectors (tests/unit parametrises over both cores by itself).
# Two workers (pytest-xdist), a test file on one worker (its module fixtures are made once): most of the
# suite's time is spent waiting on broker, etcd and Spark processes, so two at once took the native run on
# this 2-core machine from 17 to 11 minutes.
PURE_TESTS := tests/storage tests/faults tests/test_selected_core.py
PARALLEL := -n 2 --dist loadfile
# The fast API's contract suites again with every test broker serving the native transport
# (DANUBE_FAST_TEST_NATIVE=1), so the fast clients, which choose it by themselves, run them over it: produce,
# consume, the offset reader, kill -9, restarts, the idempotent producer, the fault-injecting proxy,
# power loss, subscription operations and security (docs/TRANSPORT.md).
NATIVE_TESTS := tests/compat/test_fast_consume.py tests/compat/test_fast_crash.py \
	tests/compat/test_fast_produce.py tests/compat/test_fast_reader.py tests/compat/test_fast_through_proxy.py \
	tests/compat/test_idempotent_produce.py tests/compat/test_subscription_ops.py \
	tests/security/test_secure_broker.py tests/faults/test_power_loss.py

test: install
	$(BIN)/python -m pytest $(PARALLEL) --durations=25
	DANUBE_FAST_PURE=1 $(BIN)/python -m pytest $(PURE_TESTS)
	$(MAKE) test-native
	$(MAKE) test-debug

test-native: install
	DANUBE_FAST_TEST_NATIVE=1 $(BIN)/python -m pytest $(PARALLEL) -q -p no:cacheprovider $(NATIVE_TESTS)

# The edit loop, about 90-110 s on this 2-core machine (1,523 of 1,990 tests): the suite without the tests marked
# (pyproject.toml) slow (crash and kill tests, the benchmark runs), spark (PySpark and a JVM), cluster
# (cluster mode: broker processes or nodes on etcd), etcd (a real etcd: the etcd half of the metadata
# contract suite, election, backup, local cache), broker_process (standalone broker subprocesses: most of
# tests/compat and the Spark tests) and browser (the web console in headless Chromium); stops at the first
# failure. Still in: unit, storage, tier (folder and moto S3), the in-process broker, schema, the embedded
# metadata store, faults, the source checks. `make test` runs everything.
QUICK_MARKERS := not slow and not spark and not cluster and not etcd and not broker_process and not browser
quicktest: install
	$(BIN)/python -m pytest $(PARALLEL) -x -q -m "$(QUICK_MARKERS)"

test-pure: install
	DANUBE_FAST_PURE=1 $(BIN)/python -m pytest $(PURE_TESTS)

# The core's tests on the debug build (DANUBE_FAST_DEBUG=1: bounds and wraparound checks, line tracing, -O0),
# built in a copy of the tree so the release build in place is untouched; the import check makes sure the
# tests ran on the copy's extensions.
DEBUG_TREE := build/debug-tree
DEBUG_TESTS := tests/unit tests/storage tests/faults tests/test_selected_core.py
test-debug: install
	rm -rf $(DEBUG_TREE) && mkdir -p $(DEBUG_TREE)
	cp -r danube_fast tests pyproject.toml setup.py README.md $(DEBUG_TREE)/
	find $(DEBUG_TREE)/danube_fast -name "*.so" -delete
	rm -f $(DEBUG_TREE)/danube_fast/codec/_frames.c $(DEBUG_TREE)/danube_fast/storage/_wal.c
	cd $(DEBUG_TREE) && DANUBE_FAST_DEBUG=1 $(CURDIR)/$(BIN)/python setup.py -q build_ext --inplace
	cd $(DEBUG_TREE) && $(CURDIR)/$(BIN)/python -c 'import danube_fast.codec._frames as f, danube_fast.storage._wal as w, os; \
		assert all(m.__file__.startswith(os.getcwd()) for m in (f, w)), (f.__file__, w.__file__)'
	cd $(DEBUG_TREE) && $(CURDIR)/$(BIN)/python -m pytest -q -p no:cacheprovider $(DEBUG_TESTS)

lint: install
	$(BIN)/ruff check danube_fast spark bench tests
	$(BIN)/mypy

bench: install
	$(BIN)/python -m bench storage
	$(BIN)/python -m bench meta
	$(BIN)/python -m bench broker
	$(BIN)/python -m bench fast
	$(BIN)/python -m bench.peers.install && $(BIN)/python -m bench.peers
	$(BIN)/python -m bench e2e

# Regenerate the checked-in protobuf/gRPC code from danube_fast/proto/*.proto (grpcio-tools is in the
# test extra, pinned, because the generated files carry its version; tests/compat checks they are current).
# PROTO_OUT lets that test generate into a scratch directory.
PROTO_DIR := danube_fast/proto
PROTO_OUT ?= $(PROTO_DIR)
PROTOS := $(PROTO_DIR)/DanubeApi.proto $(PROTO_DIR)/SchemaRegistry.proto $(PROTO_DIR)/DanubeAdmin.proto \
	$(PROTO_DIR)/FastApi.proto $(PROTO_DIR)/SecurityAdmin.proto $(PROTO_DIR)/PolicyAdmin.proto \
	$(PROTO_DIR)/TableAdmin.proto $(PROTO_DIR)/SubscriptionAdmin.proto $(PROTO_DIR)/BrokerStats.proto \
	$(PROTO_DIR)/Replication.proto

proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I$(PROTO_DIR) --python_out=$(PROTO_OUT) --pyi_out=$(PROTO_OUT) \
		--grpc_python_out=$(PROTO_OUT) $(PROTOS)
	$(BIN)/python scripts/fix_proto_imports.py $(PROTO_OUT)

clean:
	rm -rf build $(VENV) danube_fast/codec/*.so danube_fast/storage/*.so danube_fast/codec/_frames.c danube_fast/storage/_wal.c .pytest_cache .mypy_cache .ruff_cache .hypothesis
