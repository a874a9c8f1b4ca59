package server

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/poller"
)

// ForceAuthHeader carries, on POST /force, the proof that the caller holds
// the cluster secret (when the cluster has one): ForceAuth's value, an
// HMAC of the command, so the secret itself never crosses the wire.
const ForceAuthHeader = "X-Rdmakv-Auth"

// ForceAuth is the ForceAuthHeader value for forcing group g from the
// accepted header h (its /status "accepted"), with the cluster secret.
func ForceAuth(secret []byte, g int, h Hdr) string {
	m := hmac.New(sha256.New, secret)
	fmt.Fprintf(m, "rdmakv force-new-cluster group=%d epoch=%d count=%d", g, uint64(h.Epoch), h.Count)
	return hex.EncodeToString(m.Sum(nil))
}

// checkForceAuth reports whether got is ForceAuth's value.
func checkForceAuth(secret []byte, g int, h Hdr, got string) bool {
	want := ForceAuth(secret, g, h)
	return hmac.Equal([]byte(want), []byte(got))
}

// SetHandle records the poller handle that polls the replica: commands
// that change its state (ForceLead) run there, between two Polls.
func (p *Replica) SetHandle(h *poller.Handle) {
	p.mu.Lock()
	p.h = h
	p.mu.Unlock()
}

// errNoHandle: the replica runs under a poller that takes no commands.
var errNoHandle = errors.New("this replica takes no commands (an embedded cluster's): force-new-cluster is for replicas run by kvserver --config")

// ForceLead runs broadcast.Replica.ForceLead(confirm) on the replica's
// poller (confirm: the accepted header the operator saw) and returns the
// forced vote's epoch (docs/deploy.md, "When a whole group is down").
func (p *Replica) ForceLead(confirm broadcast.MsgHdr) (broadcast.Epoch, error) {
	p.mu.Lock()
	h := p.h
	p.mu.Unlock()
	if h == nil {
		return 0, errNoHandle
	}
	var e broadcast.Epoch
	var ferr error
	if err := h.Do(func() { e, ferr = p.r.Multicast().Broadcast().ForceLead(confirm) }); err != nil {
		return 0, err
	}
	return e, ferr
}
