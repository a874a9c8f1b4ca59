package wal

// inlineRule decides which batches a FileDevice with SetInline runs on
// the submitter's goroutine (docs/dev/durability-plan.md, sx1's
// paragraph). Inline saves the batch two thread wake-ups (the device
// goroutine's for the write, the poller's for the completion), but the
// submitter, the process's one poller, appends nothing while it waits in
// the fdatasync: when records come during a batch's fdatasync (many
// writers: the device's Continue then starts the next batch at once), the
// next batch starts a poller pass later, and sync x64 lost 20-35% in
// measurements with every idle batch inline. So batches go inline only
// while the stream is sparse: every probeEvery-th batch still goes to the
// device's goroutine, and a completion there whose Continue found records
// due (Continued(true)) makes the stream dense: no batch goes inline until
// sparseAfter completions in a row found none. Pure; the device calls it
// under its mutex.
type inlineRule struct {
	dense     bool // records came during a device-run batch's fdatasync lately
	quiet     int  // dense: completions in a row that found no record due
	sinceProb int  // inline batches since the last probe
	lastWrite bool // the last write ran inline (its sync goes inline too)

	alwaysInline bool // planted (tests): no probes, dense ignored
}

const (
	inlineProbeEvery  = 8
	inlineSparseAfter = 8
)

// write: a batch's write comes to an idle device; whether it runs inline.
func (r *inlineRule) write() bool {
	switch {
	case r.alwaysInline:
		r.lastWrite = true
	case r.dense || r.sinceProb >= inlineProbeEvery:
		r.sinceProb = 0
		r.lastWrite = false
	default:
		r.sinceProb++
		r.lastWrite = true
	}
	return r.lastWrite
}

// sync: a sync comes to an idle device; inline if its write was.
func (r *inlineRule) sync() bool { return r.lastWrite }

// continued: a completion on the device's goroutine was continued;
// started: the continuation found records due and started a batch.
func (r *inlineRule) continued(started bool) {
	switch {
	case started:
		r.dense, r.quiet = true, 0
	case r.dense:
		r.quiet++
		if r.quiet >= inlineSparseAfter {
			r.dense, r.quiet = false, 0
		}
	}
}
