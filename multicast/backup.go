package multicast

import "encoding/binary"

// InitialState is the snapshot state (as the group's FSM snapshot lays it
// out: TRAM's state, then the application's bytes app) of a group of cfg
// that has delivered delivered messages and holds nothing else: no client
// registered, nothing consumed from the parent ring, nothing forwarded to
// children. `kvserver restore` starts a new cluster from a backup with it
// (kv.BackupImage): the backup's cut leaves no message between groups.
func InitialState(cfg Config, delivered uint64, app []byte) ([]byte, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := newState(&cfg, nil, &testingKnobs{})
	s.delivered = delivered
	own := s.encode(nil)
	b := make([]byte, 8, 8+len(own)+len(app))
	binary.LittleEndian.PutUint64(b, uint64(len(own)))
	b = append(b, own...)
	return append(b, app...), nil
}
