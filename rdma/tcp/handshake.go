package tcp

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/rdmakv/rdmakv/rdma"
)

// Sentinel errors of the handshake, returned (wrapped) by Node.Connect.
var (
	// ErrAuth means the two nodes do not hold the same cluster secret.
	ErrAuth = errors.New("tcp: authentication failed (cluster secrets differ)")
	// ErrVersion means the two nodes speak different protocol versions.
	ErrVersion = errors.New("tcp: protocol version mismatch")
)

const (
	labelAcceptor = "rdmakv/tcp acceptor"
	labelDialer   = "rdmakv/tcp dialer"
)

// handshakeMAC is the proof that the sender holds secret, bound to both
// node ids, the version and both nonces.
func handshakeMAC(secret []byte, label string, ver uint16, d, a rdma.NodeID, nd, na *[32]byte) [32]byte {
	h := hmac.New(sha256.New, secret)
	var b []byte
	b = append(b, label...)
	b = le.AppendUint16(b, ver)
	b = le.AppendUint32(b, uint32(d))
	b = le.AppendUint32(b, uint32(a))
	b = append(b, nd[:]...)
	b = append(b, na[:]...)
	h.Write(b)
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}

func sendHs(nc net.Conn, m *hsMsg) error {
	var buf [helloLen]byte
	_, err := nc.Write(appendHsMsg(buf[:0], m))
	return err
}

func recvHs(nc net.Conn) (hsMsg, error) {
	var buf [helloLen]byte
	if _, err := io.ReadFull(nc, buf[:]); err != nil {
		return hsMsg{}, err
	}
	return decodeHsMsg(buf[:])
}

func statusText(st uint8) string {
	switch st {
	case stBadVersion:
		return "protocol version mismatch"
	case stWrongNode:
		return "wrong node id"
	case stAuth:
		return "authentication failed"
	case stClosing:
		return "node closing"
	}
	return fmt.Sprintf("status %d", st)
}

// dialHandshake authenticates a freshly dialed connection to peer at addr;
// the caller has set the deadline.
func dialHandshake(nc net.Conn, self, peer rdma.NodeID, addr string, secret []byte) error {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("tcp: connect to node %d at %s: "+format, append([]any{peer, addr}, args...)...)
	}
	hello := hsMsg{Version: wireVersion, Type: hsHello, From: self, To: peer}
	if _, err := rand.Read(hello.Nonce[:]); err != nil {
		return fail("nonce: %v", err)
	}
	if err := sendHs(nc, &hello); err != nil {
		return fail("send hello: %v: %w", err, rdma.ErrPeerDead)
	}
	ch, err := recvHs(nc)
	switch {
	case errors.Is(err, errMalformed):
		return fail("not an rdmakv tcp node: %v: %w", err, rdma.ErrPeerDead)
	case err != nil:
		return fail("handshake: %v: %w", err, rdma.ErrPeerDead)
	case ch.Version != wireVersion:
		return fail("peer speaks version %d, this node %d: %w", ch.Version, wireVersion, ErrVersion)
	case ch.Type == hsReject && ch.Status == stWrongNode:
		return fail("the node listening there is not node %d: %w", peer, rdma.ErrUnknownPeer)
	case ch.Type == hsReject && ch.Status == stBadVersion:
		return fail("peer rejects version %d: %w", wireVersion, ErrVersion)
	case ch.Type == hsReject:
		return fail("rejected: %s: %w", statusText(ch.Status), rdma.ErrPeerDead)
	case ch.Type != hsChallenge:
		return fail("unexpected handshake message type %d: %w", ch.Type, rdma.ErrPeerDead)
	case ch.From != peer || ch.To != self:
		return fail("the node listening there is node %d (answering %d), not node %d: %w", ch.From, ch.To, peer, rdma.ErrUnknownPeer)
	}
	want := handshakeMAC(secret, labelAcceptor, wireVersion, self, peer, &hello.Nonce, &ch.Nonce)
	if !hmac.Equal(want[:], ch.MAC[:]) {
		sendHs(nc, &hsMsg{Version: wireVersion, Type: hsReject, Status: stAuth, From: self, To: peer})
		return fail("peer does not prove the cluster secret: %w", ErrAuth)
	}
	proof := hsMsg{Version: wireVersion, Type: hsProof, From: self, To: peer}
	proof.MAC = handshakeMAC(secret, labelDialer, wireVersion, self, peer, &hello.Nonce, &ch.Nonce)
	if err := sendHs(nc, &proof); err != nil {
		return fail("send proof: %v: %w", err, rdma.ErrPeerDead)
	}
	w, err := recvHs(nc)
	switch {
	case err != nil:
		return fail("handshake: %v: %w", err, rdma.ErrPeerDead)
	case w.Type == hsReject && w.Status == stAuth:
		return fail("peer rejects our proof of the cluster secret: %w", ErrAuth)
	case w.Type == hsReject:
		return fail("rejected: %s: %w", statusText(w.Status), rdma.ErrPeerDead)
	case w.Type != hsWelcome || w.From != peer || w.To != self || w.Version != wireVersion:
		return fail("unexpected handshake message type %d: %w", w.Type, rdma.ErrPeerDead)
	}
	return nil
}

// acceptHandshake authenticates an accepted connection and returns the
// dialer's id; the caller has set the deadline. A connection that fails is
// told why (when that reveals nothing) and must be closed by the caller.
func acceptHandshake(nc net.Conn, self rdma.NodeID, secret []byte) (rdma.NodeID, error) {
	hello, err := recvHs(nc)
	if err != nil {
		return 0, fmt.Errorf("tcp: node %d: accept from %s: %w", self, nc.RemoteAddr(), err)
	}
	reject := func(st uint8, format string, args ...any) (rdma.NodeID, error) {
		sendHs(nc, &hsMsg{Version: wireVersion, Type: hsReject, Status: st, From: self, To: hello.From})
		return 0, fmt.Errorf("tcp: node %d: accept from %s (node %d): "+format, append([]any{self, nc.RemoteAddr(), hello.From}, args...)...)
	}
	switch {
	case hello.Version != wireVersion:
		return reject(stBadVersion, "version %d, want %d: %w", hello.Version, wireVersion, ErrVersion)
	case hello.Type != hsHello:
		return reject(stAuth, "expected hello, got message type %d: %w", hello.Type, errMalformed)
	case hello.To != self:
		return reject(stWrongNode, "dialer wants node %d: %w", hello.To, rdma.ErrUnknownPeer)
	}
	ch := hsMsg{Version: wireVersion, Type: hsChallenge, From: self, To: hello.From}
	if _, err := rand.Read(ch.Nonce[:]); err != nil {
		return reject(stClosing, "nonce: %v", err)
	}
	ch.MAC = handshakeMAC(secret, labelAcceptor, wireVersion, hello.From, self, &hello.Nonce, &ch.Nonce)
	if err := sendHs(nc, &ch); err != nil {
		return 0, fmt.Errorf("tcp: node %d: accept from %s: %w", self, nc.RemoteAddr(), err)
	}
	proof, err := recvHs(nc)
	if err != nil {
		return 0, fmt.Errorf("tcp: node %d: accept from %s: %w", self, nc.RemoteAddr(), err)
	}
	want := handshakeMAC(secret, labelDialer, wireVersion, hello.From, self, &hello.Nonce, &ch.Nonce)
	if proof.Type != hsProof || proof.From != hello.From || proof.To != self || !hmac.Equal(want[:], proof.MAC[:]) {
		return reject(stAuth, "bad proof of the cluster secret: %w", ErrAuth)
	}
	if err := sendHs(nc, &hsMsg{Version: wireVersion, Type: hsWelcome, From: self, To: hello.From}); err != nil {
		return 0, fmt.Errorf("tcp: node %d: accept from %s: %w", self, nc.RemoteAddr(), err)
	}
	return hello.From, nil
}
