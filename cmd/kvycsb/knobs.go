package main

// benchKnobs are planted bugs of kvycsb bench, for the tests that must
// catch them; all false in a real run.
var benchKnobs struct {
	// keepClusterRunning skips freezing the embedded cluster during
	// Redis's phases (the old bench: the idle cluster took CPU from the
	// baseline). TestBenchBaselineFrozen catches it as "beside a running
	// cluster".
	keepClusterRunning bool
}
