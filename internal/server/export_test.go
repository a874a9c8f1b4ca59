package server

// SetBackupLateGroup plants the lateGroup bug (backupKnobs) in group g's
// replicas of the process pc starts.
func SetBackupLateGroup(pc *ProcessConfig, g int) { pc.backupKnobs.lateGroup = g + 1 }
