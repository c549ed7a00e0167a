# The two commands of the README: `make test` and `make demo`. Both install
# missing Debian packages first (scripts/install-deps.sh, as root).
BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
JOBS ?= 2

.PHONY: all deps build test test-asan test-tsan demo bench install clean fuzz

all: build

deps:
	bash scripts/install-deps.sh

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

# ctest -j $(JOBS): the tests that must run alone (emulated hosts, timings)
# say so themselves (RUN_SERIAL, RESOURCE_LOCK: end of test/CMakeLists.txt).
test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	$(MAKE) test-asan
	$(MAKE) test-tsan

# The same suite built with AddressSanitizer + UndefinedBehaviorSanitizer,
# the multi-host scheduler runs included (sched_hosts, sched_slurm: they poll
# the jobs' state with generous deadlines instead of fixed sleeps). What runs
# in the Release build only (docs/testing.md, "Keeping make test short"):
# test/CMakeLists.txt's `if(NOT TIDE_SANITIZE)` blocks.
test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DTIDE_SANITIZE=ON \
	  -DTIDE_BUILD_BENCH_PEERS=OFF >/dev/null
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && TIDE_SANITIZED=1 ctest --output-on-failure -j $(JOBS)

# ThreadSanitizer on the suites where threads meet: the store's server
# thread and its clients (test_store), a communicator's watcher and progress
# threads (test_coll, test_fault), HiTopKComm and the compressor's worker
# threads (test_sparse, test_compress). Optimised (-O2): the kernels are
# slow enough instrumented. Any report fails the test (halt_on_error); no
# suppressions.
TSAN_TESTS = test_store test_coll test_fault test_sparse test_compress
test-tsan: deps
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTIDE_TSAN=ON \
	  -DTIDE_BUILD_BENCH_PEERS=OFF >/dev/null
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target $(TSAN_TESTS)
	cd $(TSAN_BUILD) && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" TIDE_TEST_MAX_COUNT=16411 \
	  ctest --output-on-failure -j $(JOBS) -R '^(test_store|test_coll/.*|test_fault|test_sparse|test_compress)$$'

# The libFuzzer harnesses (fuzz/, docs/security.md), each for FUZZ_SECONDS.
# make test runs them for 5 s each (ctest's fuzz_* tests).
FUZZ_SECONDS ?= 300
FUZZ_BUILD ?= build-fuzz
fuzz: deps
	bash scripts/fuzz.sh --seconds $(FUZZ_SECONDS) --build $(FUZZ_BUILD)

demo: build
	bash scripts/demo.sh $(BUILD)

bench: build
	bash scripts/bench-allreduce.sh $(BUILD)

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD)
