package wal

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/internal/vfs"
	"github.com/rdmakv/rdmakv/internal/vfs/errorfs"
)

// TestFileDeviceInline: with SetInline, a small write or a sync submitted
// to an idle device completes within Submit, on the submitter's goroutine
// (Reap has it at once, the wake is called after a non-Quiet one); a large
// write, another kind, or any IO submitted while another is queued or
// running goes to the device's goroutine, and the completions come in the
// order of the submits. Planted inlineBusy (an IO inline while another is
// in flight) is caught ("order:").
func TestFileDeviceInline(t *testing.T) {
	if err := inlineCase(false); err != nil {
		t.Fatal(err)
	}
	err := inlineCase(true)
	if err == nil || err.Error()[:6] != "order:" {
		t.Fatalf("planted inlineBusy: want an order: failure, got %v", err)
	}
}

func inlineCase(inlineBusy bool) error {
	gate := make(chan struct{})
	var blockAlloc atomic.Bool
	fs := errorfs.Wrap(vfs.NewMem(), errorfs.Func(func(op errorfs.Op) error {
		if op.Kind == errorfs.OpAllocate && blockAlloc.Load() {
			<-gate
		}
		return nil
	}))
	path := filepath.Join("/d", "f")
	if err := fs.MkdirAll("/d", 0o700); err != nil {
		return err
	}
	kicks := make(chan struct{}, 64)
	d := NewFileDevice(fs, func() { kicks <- struct{}{} })
	defer d.Close()
	d.inlineBusy = inlineBusy
	var wakes atomic.Int64
	d.SetInline(func() { wakes.Add(1) })
	var got []Done
	reapUntil := func(n int) error {
		deadline := time.Now().Add(time.Minute)
		for len(got) < n {
			got = d.Reap(got)
			if time.Now().After(deadline) {
				return fmt.Errorf("no completion in a minute (%d of %d)", len(got), n)
			}
			time.Sleep(100 * time.Microsecond)
		}
		return nil
	}
	// Not inline: a create.
	d.Submit(IO{Kind: IOCreate, Path: path, Tag: 1})
	if err := reapUntil(1); err != nil {
		return err
	}
	// Inline: a small write and a sync on an idle device, done at once.
	d.Submit(IO{Kind: IOWrite, Path: path, Data: []byte("abc"), Tag: 2, Quiet: true})
	d.Submit(IO{Kind: IOSync, Path: path, Tag: 3})
	if got = d.Reap(got); len(got) != 3 || d.Stats().Inline != 2 || wakes.Load() != 1 {
		return fmt.Errorf("inline: %d completions, %d inline, %d wakes after an idle write and sync (want 3, 2, 1)", len(got), d.Stats().Inline, wakes.Load())
	}
	// Not inline: a write above InlineMax.
	d.Submit(IO{Kind: IOWrite, Path: path, Off: 8192, Data: make([]byte, InlineMax+1), Tag: 4})
	if err := reapUntil(4); err != nil {
		return err
	}
	if n := d.Stats().Inline; n != 2 {
		return fmt.Errorf("inline: a write of %d bytes ran inline", InlineMax+1)
	}
	// Busy: an allocate holds the device's goroutine; a write and a sync
	// submitted behind it must wait for it.
	blockAlloc.Store(true)
	d.Submit(IO{Kind: IOAllocate, Path: path, Len: 4096, Tag: 5})
	done := make(chan struct{})
	go func() {
		d.Submit(IO{Kind: IOWrite, Path: path, Off: 3, Data: []byte("de"), Tag: 6, Quiet: true})
		d.Submit(IO{Kind: IOSync, Path: path, Tag: 7})
		close(done)
	}()
	// the allocate may not have started yet: let the two submits land
	select {
	case <-done:
	case <-time.After(10 * time.Millisecond):
	}
	close(gate)
	<-done
	if err := reapUntil(7); err != nil {
		return err
	}
	for i, c := range got {
		if c.Tag != uint64(i+1) || c.Err != nil {
			return fmt.Errorf("order: completion %d is tag %d (err %v), want tag %d: an IO ran ahead of one submitted before it", i, c.Tag, c.Err, i+1)
		}
	}
	if n := d.Stats().Inline; n != 2 {
		return fmt.Errorf("inline: %d IOs ran inline, want 2 (none while the allocate was in flight)", n)
	}
	if len(got) != 7 {
		return fmt.Errorf("completions: %d, want 7", len(got))
	}
	b := make([]byte, 5)
	f, err := fs.OpenFile(path, 0, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.ReadAt(b, 0); err != nil || string(b) != "abcde" {
		return fmt.Errorf("data: read %q (%v), want abcde", b, err)
	}
	return nil
}

// TestInlineRule: a sparse stream's batches run inline but every
// inlineProbeEvery+1-th, which goes to the device's goroutine; a
// continuation that found records due there (a dense stream) stops the
// inline batches until inlineSparseAfter continuations in a row found
// none. Planted alwaysInline (no probe, dense ignored) is caught
// ("dense:").
func TestInlineRule(t *testing.T) {
	if err := inlineRuleCase(inlineRule{}); err != nil {
		t.Fatal(err)
	}
	err := inlineRuleCase(inlineRule{alwaysInline: true})
	if err == nil || !strings.HasPrefix(err.Error(), "dense:") {
		t.Fatalf("planted alwaysInline: want a dense: failure, got %v", err)
	}
}

func inlineRuleCase(r inlineRule) error {
	// sparse: inline but the probes; a probe's sync goes with it
	inline := 0
	for i := range 3 * (inlineProbeEvery + 1) {
		w := r.write()
		if w != r.sync() {
			return fmt.Errorf("sync: batch %d's write inline %v, its sync %v", i, w, r.sync())
		}
		if w {
			inline++
		} else {
			r.continued(false) // the probe found nothing due
		}
	}
	if inline == 3*(inlineProbeEvery+1) {
		if err := inlineDense(&r); err != nil {
			return err
		}
		return fmt.Errorf("probe: every batch of a sparse stream ran inline")
	}
	if inline != 3*inlineProbeEvery {
		return fmt.Errorf("sparse: %d of %d batches inline, want %d", inline, 3*(inlineProbeEvery+1), 3*inlineProbeEvery)
	}
	return inlineDense(&r)
}

// inlineDense: after a continuation started a batch, none inline until
// inlineSparseAfter continuations in a row found nothing.
func inlineDense(r *inlineRule) error {
	r.continued(true)
	for i := range 3 * inlineSparseAfter {
		if r.write() {
			return fmt.Errorf("dense: batch %d after a continuation started one ran inline", i)
		}
		r.continued(i%2 == 1) // half the completions find records due, the last one too
	}
	for i := range inlineSparseAfter {
		if r.write() {
			return fmt.Errorf("dense: batch %d of %d quiet ones ran inline", i, inlineSparseAfter)
		}
		r.continued(false)
	}
	if !r.write() {
		return fmt.Errorf("sparse again: no batch inline after %d quiet continuations", inlineSparseAfter)
	}
	return nil
}
