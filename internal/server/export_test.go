package server

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/rdmakv/rdmakv/poller"
	"github.com/rdmakv/rdmakv/rdma"
	"github.com/rdmakv/rdmakv/wal"
)

// SetBackupLateGroup plants the lateGroup bug (backupKnobs) in group g's
// replicas of the process pc starts.
func SetBackupLateGroup(pc *ProcessConfig, g int) { pc.backupKnobs.lateGroup = g + 1 }

// SetRestoreZeroHeader plants restoreKnobs.zeroHeader in o.
func SetRestoreZeroHeader(o *RestoreOptions) { o.knobs.zeroHeader = true }

// PollStableSaves is how many stable state saves r's Stable ran on its
// polling goroutine (the boot save, and every save of a Stable that is
// not an AsyncStable).
func PollStableSaves(r *Replica) uint64 { return r.stable.saves }

// CaptureThreadLocks is how many thread locks replica (g, i)'s capture
// CPU clock holds between its Polls (read on its polling goroutine): 0
// unless a Poll's locks were not undone (Durable.unlockThread).
func CaptureThreadLocks(p *Process, g, i int) (int, error) {
	h := p.get(g, i)
	if h == nil || h.dur == nil {
		return 0, fmt.Errorf("no durable replica %d of group %d", i, g)
	}
	n := 0
	err := h.h.Do(func() { n = h.dur.locked })
	return n, err
}

// SetStartPollEach plants the pollEach bug (startKnobs) in the process pc
// starts.
func SetStartPollEach(pc *ProcessConfig) { pc.startKnobs.pollEach = true }

// SetSaveBug plants the save passes' bug named bug ("noEnd", "noLeader")
// in the process pc starts; "noGate" is the process without its SaveGate
// (ProcessConfig.SavesAtOnce: the replicas save all at once).
func SetSaveBug(pc *ProcessConfig, bug string) {
	if bug == "noGate" {
		pc.SavesAtOnce = true
		return
	}
	pc.saveBug = map[string]saveBug{"noEnd": saveNoEnd, "noLeader": saveNoLeader}[bug]
}

// SavesOpen is how many disk snapshot saves the process's replicas have
// under way (their intervals open in its Watch of saves).
func SavesOpen(p *Process) int { return p.saves.Open() }

// SaveGateTaken is how many disk snapshot captures the process's
// SaveGate let start.
func SaveGateTaken(p *Process) uint64 { return p.saveGate.Taken() }

// SetSharedEarlySynced plants the earlySynced bug (sharedKnobs) in the
// shared log of the process pc starts.
func SetSharedEarlySynced(pc *ProcessConfig) { pc.startKnobs.shared.earlySynced = true }

// SharedLogDir is the shared log the replica at (g, i) writes ("" if
// none).
func SharedLogDir(p *Process, g, i int) string {
	h := p.get(g, i)
	if h == nil || h.dur == nil {
		return ""
	}
	return h.dur.sharedDir()
}

// ProcessSpare is the spare P of p's pollers (poller.Group.Spare) and
// whether they hold their parks now.
func ProcessSpare(p *Process) (poller.Spare, bool) { return p.pollers.Spare(), p.pollers.Holding() }

// WatchStatus is what Watch reads of r (watchStatus).
func WatchStatus(r *Replica) ReplicaStatus { return r.watchStatus() }

// SaveHold holds disk snapshot saves between their write and their
// fsync, for good: the device refuses the fsync of a tmp-
// file as a full queue does (the store asks again at its next Poll).
type SaveHold struct{ refused atomic.Int64 }

// Refused is how many fsyncs of a held save the device refused.
func (h *SaveHold) Refused() int64 { return h.refused.Load() }

type holdDevice struct {
	wal.Device
	h *SaveHold
}

func (d holdDevice) Submit(op wal.IO) bool {
	if op.Kind == wal.IOSync && strings.HasPrefix(filepath.Base(op.Path), "tmp-") {
		d.h.refused.Add(1)
		return false
	}
	return d.Device.Submit(op)
}

// HoldSaves holds every disk snapshot save of members of the process
// pc starts (SaveHold). Hold one member a group: a follower's install
// of its leader's snapshot is held too, and its acknowledgements wait
// for it.
func HoldSaves(pc *ProcessConfig, members ...rdma.NodeID) *SaveHold {
	h := &SaveHold{}
	pc.Durable.snapDev = func(id rdma.NodeID, d wal.Device) wal.Device {
		if !slices.Contains(members, id) {
			return d
		}
		return holdDevice{d, h}
	}
	return h
}
