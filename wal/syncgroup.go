package wal

import (
	"fmt"
	"os"
	"sync"

	"github.com/rdmakv/rdmakv/internal/vfs"
	"golang.org/x/sys/unix"
)

// SyncGroup makes one file-system-wide sync stand for the syncs of many
// files: the FileDevices of a process's Async logs on one file system
// share one (SyncGroupFor), and an IOSync on any of them returns once a
// syncfs(2) that started after the IO was called has returned. Async
// Writers polled on one clock are due at the same instants (timedDue), so
// a process's replicas reach it together and one or two syncfs calls
// cover all of them where each paid a fdatasync before: on a virtual
// machine a flush costs the caller a VM exit and an interrupt, and every
// blocking call an OS-thread hand-off (docs/dev/durability-plan.md, "async
// at x64").
//
// One sync runs at a time. A caller that finds one under way waits for it
// to end and then for the next, which it starts unless another caller
// did: the running one may have started before the caller's write reached
// the page cache. An error is kept: every later Sync returns it too (the
// kernel reports a writeback error to one syncfs per open file, so a
// caller whose pages the failure lost might otherwise see success: the
// fsyncgate rule, ErrFailStop).
type SyncGroup struct {
	sync  func() error
	knobs testingKnobs

	mu      sync.Mutex
	cond    sync.Cond
	started uint64 // syncs started
	done    uint64 // the last sync that ended (they end in order)
	running bool
	err     error // sticky
	lastErr error // the last sync's own result (knob syncErrForgotten)
	calls   uint64
}

// NewSyncGroup returns a group whose syncs call sync.
func NewSyncGroup(sync func() error) *SyncGroup {
	g := &SyncGroup{sync: sync}
	g.cond.L = &g.mu
	return g
}

// Sync returns once a call of the group's sync that started after Sync
// was called has returned, with the first error any sync of the group
// returned (nil if none did).
func (g *SyncGroup) Sync() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls++
	want := g.started + 1
	if g.knobs.syncJoinsRunning && g.running {
		want = g.started
	}
	for g.done < want && g.err == nil {
		if g.running {
			g.cond.Wait()
			continue
		}
		g.running = true
		g.started++
		gen := g.started
		g.mu.Unlock()
		err := g.sync()
		g.mu.Lock()
		g.running, g.done, g.lastErr = false, gen, err
		if err != nil && !g.knobs.syncErrForgotten {
			g.err = err
		}
		g.cond.Broadcast()
	}
	if g.knobs.syncErrForgotten {
		return g.lastErr
	}
	return g.err
}

// SyncGroupStats counts a group's work: Calls to Sync, Syncs run.
type SyncGroupStats struct{ Calls, Syncs uint64 }

// Stats returns the counts so far.
func (g *SyncGroup) Stats() SyncGroupStats {
	g.mu.Lock()
	defer g.mu.Unlock()
	return SyncGroupStats{Calls: g.calls, Syncs: g.started}
}

var syncGroups struct {
	sync.Mutex
	byDev map[uint64]*SyncGroup
}

// SyncGroupFor returns the process's SyncGroup for the file system that
// holds dir, syncing it with syncfs(2) through a descriptor of dir kept
// open for the life of the process (errors are reported from its opening
// on). It returns nil, and the caller's device syncs each file itself,
// when fsys is not vfs.OS (a wrapped file system such as errorfs must see
// each file's sync) or dir cannot be opened.
func SyncGroupFor(fsys vfs.FS, dir string) *SyncGroup {
	if fsys != vfs.OS {
		return nil
	}
	var st unix.Stat_t
	if unix.Stat(dir, &st) != nil {
		return nil
	}
	syncGroups.Lock()
	defer syncGroups.Unlock()
	if g := syncGroups.byDev[st.Dev]; g != nil {
		return g
	}
	f, err := os.Open(dir)
	if err != nil {
		return nil
	}
	fd := f.Fd()
	g := NewSyncGroup(func() error {
		if err := vfs.SyncFS(fd); err != nil {
			return fmt.Errorf("syncfs of %s's file system: %w", f.Name(), err)
		}
		return nil
	})
	if syncGroups.byDev == nil {
		syncGroups.byDev = map[uint64]*SyncGroup{}
	}
	syncGroups.byDev[st.Dev] = g
	return g
}
