package kv

// testingKnobs are the planted bugs of this package's tests (STYLE.md: fault
// knobs live in one unexported struct, as CockroachDB's TestingKnobs do),
// with the little state a bug needs. Each switch breaks the table or the
// reader in one way that a checker must catch: TestSimMutants (the
// linearizability check) and TestMetamorphicCatchesMutants (the comparison
// with a Go map) set them and require the check to fail. Production code
// never sets them: the zero value is the design as written, and every
// check is one read of a bool field of the Table or GroupReader.
type testingKnobs struct {
	// noQuorum (reader): gets trust the leader's serving word without the
	// promise quorum; the simulator also makes a deposed leader keep
	// saying it serves (lastServed).
	noQuorum bool
	// newGenOnly (reader): gets read only the new generation while the
	// index grows, missing keys not migrated yet.
	newGenOnly bool
	// noCondition (table): a compare-and-swap is applied without checking
	// its condition.
	noCondition bool
	// latePromise (table): a member's promise word is published 6 ms after
	// it changed, after its vote went out.
	latePromise bool
	// noRemigrate (table): an op of a request does not migrate its key's
	// buckets again after an earlier op of the request grew the index
	// (the bug the metamorphic tests found).
	noRemigrate bool

	// State of the bugs above (table).
	lastServed uint64 // noQuorum: the last epoch this table served
	promise    uint64 // latePromise: the promise not yet published
	promiseAt  int64  // latePromise: when it changed (TableConfig.Clock)
}
