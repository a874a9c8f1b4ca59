# rdmakv developer entry points. `make test` is the one test command (README,
# .ci/run): gofmt and go vet, the allocation tests without the race detector
# (noalloc), the timing-sensitive tests without it (norace), every package's
# tests with it (unit), then a short run of every fuzz target (fuzz-short).
# `make soak` runs the simulators with long seed counts (not in make test).
# `make run` is the one run command: an embedded local cluster (kvserver
# with no arguments); `make bench` runs the fabric benchmark.

GO ?= go
# A count of executions, not a duration: see scripts/fuzz-short (golang/go#75804).
FUZZTIME ?= 15000x

.PHONY: test run vet noalloc norace unit fuzz-short soak bench ycsb

test: vet noalloc norace unit fuzz-short

# go test vets each package it builds (a subset of go vet's analyzers),
# again in every pass: the race pass, noalloc, norace and fuzz-short's
# fuzzing builds. make test's vet step has run go vet ./... (every
# analyzer, test files included) first, so the passes skip it: a full
# go vet of the module is ~66 s of CPU here with its cache cold (load ~30).
# Only the few files built with -race alone (race_test.go: raceEnabled =
# true) are not vetted; `make unit` by itself runs no vet.
TESTVET ?= -vet=off

# vet also fails when go.mod or go.sum is not tidy (go mod tidy -diff prints
# the change it would make and exits 1): run `go mod tidy` and commit.
vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	@$(GO) mod tidy -diff || { echo "go.mod/go.sum not tidy: run go mod tidy"; exit 1; }
	@./scripts/check-norace $(NORACE_LISTS) -- '$(NOALLOC_PKGS)' '$(NOALLOC_RUN)'
	$(GO) vet ./...

# The testing.AllocsPerRun tests skip under -race (the race detector
# allocates on its own), so unit never runs them: this pass does, without
# -race. NOALLOC_RUN selects exactly them: each fabric's conformance
# subtests NoAllocs, PostList/NoAllocs, WaitSet/NoAllocs and Link/NoAllocs (rdma/fabrictest), tcp's
# TestSteadyStateAllocs, broadcast's TestSlabReuse (which also runs in
# unit) and TestWALEntryAllocs (an entry's log record), kv's TestGetAllocs, TestMergeAllocs (a merge apply),
# TestOrderedLookupAllocs and TestOrderedScanReusesBuffers (an
# OrderedReader's warm lookups and scans), client's TestPutAllocs (one Put, the
# replicas in 3 kvproc processes) and TestQueuedPutAllocs (a Put queued
# behind a full window until its deadline), shm's TestProcWatchAllocs (the
# periodic liveness check of a peer) and TestCheckLiveAllocs (what is left
# of it on the Post path), poller's TestPassNoAllocs and btree's
# TestWarmLookupAllocs. The pass fails if any is skipped or if fewer than NOALLOC_TESTS of
# them pass (a renamed test would otherwise drop out of the regexp silently);
# a new allocation test goes into NOALLOC_RUN and NOALLOC_TESTS.
NOALLOC_PKGS := ./rdma/mem ./rdma/shm ./rdma/tcp ./broadcast ./kv ./client ./poller ./btree
NOALLOC_RUN := ^(TestConformance|TestSteadyStateAllocs|TestWALEntryAllocs|TestSlabReuse|TestGetAllocs|TestMergeAllocs|TestOrderedLookupAllocs|TestOrderedScanReusesBuffers|TestPutAllocs|TestQueuedPutAllocs|TestProcWatchAllocs|TestCheckLiveAllocs|TestPassNoAllocs|TestWarmLookupAllocs)$$/^(NoAllocs|PostList|WaitSet|Link)$$/^NoAllocs$$
# 3 fabrics x 4 subtests, TestSteadyStateAllocs, broadcast's TestWALEntryAllocs, TestSlabReuse, kv's TestGetAllocs, TestMergeAllocs, TestOrderedLookupAllocs and TestOrderedScanReusesBuffers, client's TestPutAllocs and TestQueuedPutAllocs, shm's TestProcWatchAllocs and TestCheckLiveAllocs, poller's TestPassNoAllocs, btree's TestWarmLookupAllocs:
NOALLOC_TESTS := 25

noalloc:
	@out=$$($(GO) test $(TESTVET) -v -timeout 5m -run '$(NOALLOC_RUN)' $(NOALLOC_PKGS) 2>&1); st=$$?; \
	[ $$st -eq 0 ] || { printf '%s\n' "$$out"; exit $$st; }; \
	printf '%s\n' "$$out" | grep -E -e '--- (PASS|SKIP)|^ok'; \
	if printf '%s\n' "$$out" | grep -qE -e '--- SKIP|no tests to run'; then echo "noalloc: an allocation test was skipped or not selected"; exit 1; fi; \
	n=$$(printf '%s\n' "$$out" | grep -cE -e '--- PASS: (TestConformance/((PostList|WaitSet|Link)/)?NoAllocs|TestSteadyStateAllocs|TestWALEntryAllocs|TestSlabReuse|TestGetAllocs|TestMergeAllocs|TestOrderedLookupAllocs|TestOrderedScanReusesBuffers|TestPutAllocs|TestQueuedPutAllocs|TestProcWatchAllocs|TestCheckLiveAllocs|TestPassNoAllocs|TestWarmLookupAllocs) '); \
	[ "$$n" -eq $(NOALLOC_TESTS) ] || { echo "noalloc: $$n allocation tests passed, want $(NOALLOC_TESTS)"; exit 1; }

# Tests that skip assertions or seeds under -race (it slows everything
# several times) run here in full. A simulator seed is one goroutine, so
# the race detector has nothing to check in it: under -race most
# simulators skip (below) or run a token count, here their whole count.
# broadcast's TestLargeSnapshotCatchUp (no Poll of the leader runs long
# while a 64 MiB snapshot is taken and fetched), TestSimAcuerdo (2,000
# seeds), TestSimForceLead (300 and 150 seeds), TestSimAsymmetricPartition
# (40 seeds a case), TestSimMutants (its deliver-uncommitted case needs
# ~1300 seeds), all skipped under -race,
# groupproc's TestFSMPersistPreemptible (a Persist loop that the race
# detector's instrumentation makes preemptible anyway), multicast's
# TestSim with all its seeds (760 per tree shape), TestSimAbandon (33 a
# shape), TestSimClientRate and TestSimMutants (single-goroutine runs:
# skipped under -race), sim's TestCounterSim (1,000 seeds; 20 under -race),
# and kv's TestSim with all its seeds (100 a case, a third of that for the
# batches case) and TestSimTorn (30 a case, 2 cases) and TestSimTornMutants,
# TestSimDurable and TestSimMoves, all skipped under -race. Deterministic single-goroutine tests that skip under -race
# (simNoRace, singleNoRace) run here only: every TestSim* test of broadcast
# (the token seeds above included) and TestStuckGroupParksCatchesNoBackoff
# (a queued cluster in virtual time), kv's TestSim, TestSimTorn,
# TestSimDurable, TestSimMoves, TestSimOrdered (their token seeds), TestSimMutants,
# TestSimOrderedMutants, TestSimDurableMutants, TestSimMovesMutants and
# TestSimDurableWindowFromUnsyncedCrash, and btree's NORACE_BTREE (trees
# built and checked on the test's goroutine). kv's TestSimOrdered runs here
# with its default 20 seeds a case (it ran 2 a case under -race only).
# `make soak` runs the simulators longer.
# The lists, one a package (Go regexps, unanchored): scripts/check-norace
# (make vet) fails if a name in one is no test of its package (renamed or
# deleted), or if a test that skips under -race is in none of them nor in
# NOALLOC_RUN (it would run nowhere).
NORACE_BROADCAST := TestLargeSnapshotCatchUp|TestSim.*|TestStuckGroupParksCatchesNoBackoff
NORACE_GROUPPROC := TestFSMPersistPreemptible
NORACE_MULTICAST := TestSim|TestSimAbandon|TestSimClientRate|TestSimMutants
NORACE_KV := TestSim|TestSimMutants|TestSimOrdered|TestSimOrderedMutants|TestSimTorn|TestSimTornMutants|TestSimDurable|TestSimDurableMutants|TestSimDurableWindowFromUnsyncedCrash|TestSimMoves|TestSimMovesMutants
NORACE_BTREE := TestUsageMatchesWalk|TestStoreTabletSplit|TestInPlaceSameBytes|TestStoreMulti|TestLoad
NORACE_SIM := TestCounterSim
# e2e's TestBalancerProcessesTCP: kvserver processes (never raced) on tcp;
# raced, its client's load was the race pass's longest test at load 40.
NORACE_E2E := TestBalancerProcessesTCP
NORACE_LISTS := ./broadcast '$(NORACE_BROADCAST)' ./internal/groupproc '$(NORACE_GROUPPROC)' ./multicast '$(NORACE_MULTICAST)' ./kv '$(NORACE_KV)' ./btree '$(NORACE_BTREE)' ./sim '$(NORACE_SIM)' ./internal/e2e '$(NORACE_E2E)'
norace:
	@out=$$($(GO) test $(TESTVET) -count=1 -timeout 30m -run '^($(NORACE_BROADCAST))$$' -v ./broadcast 2>&1 && \
	  $(GO) test $(TESTVET) -count=1 -timeout 5m -run '^($(NORACE_GROUPPROC))$$' -v ./internal/groupproc 2>&1 && \
	  $(GO) test $(TESTVET) -count=1 -timeout 30m -run '^($(NORACE_MULTICAST))$$' ./multicast 2>&1 && \
	  $(GO) test $(TESTVET) -count=1 -timeout 30m -run '^($(NORACE_KV))$$' ./kv 2>&1 && \
	  $(GO) test $(TESTVET) -count=1 -timeout 10m -run '^($(NORACE_BTREE))$$' ./btree 2>&1 && \
	  $(GO) test $(TESTVET) -count=1 -timeout 10m -run '^($(NORACE_SIM))$$' ./sim 2>&1 && \
	  $(GO) test $(TESTVET) -count=1 -timeout 10m -run '^($(NORACE_E2E))$$' -v ./internal/e2e 2>&1); st=$$?; \
	if [ $$st -eq 0 ]; then printf '%s\n' "$$out" | grep -E -e '--- |^(ok|FAIL)|bigsnap_test'; else printf '%s\n' "$$out"; fi; exit $$st

# The commands that tests run as processes (kvserver, kvcli, kvbench: the
# e2e, kvcli, kvserver and kvbench tests) are built once, without -race,
# before the race pass, and handed to every package's tests in
# RDMAKV_TEST_BIN: each of those packages built kvserver (or kvbench) by
# itself, and the cmd packages' tests, run side by side, compiled the same
# packages at once. Without RDMAKV_TEST_BIN (go test by hand) a test
# binary builds what it runs, once.
unit:
	bin=$$(mktemp -d "$${TMPDIR:-/tmp}/rdmakv-test-bin-XXXXXX") && \
	  $(GO) build -buildvcs=true -o "$$bin/" ./cmd/kvserver ./cmd/kvcli ./cmd/kvbench && \
	  RDMAKV_TEST_BIN=$$bin $(GO) test $(TESTVET) -race -timeout 30m ./...; \
	  st=$$?; rm -rf "$$bin"; exit $$st

# The simulators with long seed counts, without the race detector: about
# ten times what make test runs (each test's -seeds is per case), times
# SOAK_SCALE (make soak SOAK_SCALE=5). Not part of make test (it runs for
# a long time). A failing seed prints the command that reruns it.
SOAK_SCALE ?= 1
soak:
	$(GO) test -count=1 -timeout 0 -run '^TestSimAcuerdo$$' ./broadcast -seeds $$((2000 * $(SOAK_SCALE)))
	$(GO) test -count=1 -timeout 0 -run '^TestSimForceLead$$' ./broadcast -seeds $$((2000 * $(SOAK_SCALE)))
	$(GO) test -count=1 -timeout 0 -run '^TestSimAsymmetricPartition$$' ./broadcast -seeds $$((400 * $(SOAK_SCALE)))
	$(GO) test -count=1 -timeout 0 -run '^TestSim$$' ./multicast -seeds $$((2500 * $(SOAK_SCALE)))
	$(GO) test -count=1 -timeout 0 -run '^TestSimAbandon$$' ./multicast -seeds $$((1000 * $(SOAK_SCALE)))
	$(GO) test -count=1 -timeout 0 -run '^TestSim$$' ./kv -seeds $$((1500 * $(SOAK_SCALE)))
	$(GO) test -count=1 -timeout 0 -run '^TestSimTorn$$' ./kv -seeds $$((300 * $(SOAK_SCALE)))
	$(GO) test -count=1 -timeout 0 -run '^TestSimDurable$$' ./kv -seeds $$((200 * $(SOAK_SCALE)))
	$(GO) test -count=1 -timeout 0 -run '^TestSimOrdered$$' ./kv -seeds $$((200 * $(SOAK_SCALE)))
	$(GO) test -count=1 -timeout 0 -run '^TestSimMoves$$' ./kv -seeds $$((60 * $(SOAK_SCALE)))
	$(GO) test -count=1 -timeout 0 -run '^TestCounterSim$$' ./sim -seeds $$((10000 * $(SOAK_SCALE)))

# Runs every fuzz target for $(FUZZTIME) executions (the seed corpora already ran in unit).
fuzz-short:
	FUZZTIME=$(FUZZTIME) FUZZVET=$(TESTVET) ./scripts/fuzz-short

# ARGS passes flags to kvserver (make run ARGS="--groups 4"). Built, then
# exec'd rather than `go run`: Ctrl-C reaches kvserver, which stops cleanly
# and exits 0, and make has no failed child to report (go run exits 1 when
# interrupted, and make printed "*** [run] Error 1"). KVSERVER_FOREGROUND=1
# makes kvserver take the terminal's foreground for itself, so that Ctrl-C
# signals it alone: make, signalled too, died of the SIGINT once kvserver
# had stopped (exit status 130), however cleanly it stopped.
RUNBIN ?= ./kvserver
run:
	$(GO) build -o $(RUNBIN) ./cmd/kvserver
	KVSERVER_FOREGROUND=1 exec $(RUNBIN) $(ARGS)

bench:
	$(GO) run ./cmd/kvbench fabric --runs 5

# YCSB workloads A, B, C, D and F at 1, 8 and 32 threads, 100k records:
# rdmakv (an embedded cluster) against Redis (a redis-server kvycsb starts),
# same run; docs/ycsb.md. ARGS: e.g. ARGS="--records 10000 --threads 8".
ycsb:
	$(GO) run ./cmd/kvycsb bench $(ARGS)
