package server

// SetBackupLateGroup plants the lateGroup bug (backupKnobs) in group g's
// replicas of the process pc starts.
func SetBackupLateGroup(pc *ProcessConfig, g int) { pc.backupKnobs.lateGroup = g + 1 }

// PollStableSaves is how many stable state saves r's Stable ran on its
// polling goroutine (the boot save, and every save of a Stable that is
// not an AsyncStable).
func PollStableSaves(r *Replica) uint64 { return r.stable.saves }
