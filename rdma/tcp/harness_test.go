package tcp

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/rdma"
)

// The conformance harness. A cluster is a rendezvous directory: every node
// listens on 127.0.0.1:0 and, once listening, writes its address to
// <dir>/node-<id>.addr (atomically, by rename). Connect resolves the peer's
// address from the directory at call time, so nodes opened later, in other
// processes or restarted on a new port, are found. The config string
// carries the directory, the cluster size and the secret:
//
//	dir=/tmp/...&n=3&secret=<hex>

const resolveWait = 10 * time.Second

func newCluster(t testing.TB, n int) string {
	dir := t.TempDir()
	secret := make([]byte, 32)
	for i := range secret {
		secret[i] = byte(i*7 + 1)
	}
	v := url.Values{}
	v.Set("dir", dir)
	v.Set("n", strconv.Itoa(n))
	v.Set("secret", hex.EncodeToString(secret))
	return v.Encode()
}

type clusterConfig struct {
	dir    string
	n      int
	secret []byte
}

func parseConfig(config string) (clusterConfig, error) {
	v, err := url.ParseQuery(config)
	if err != nil {
		return clusterConfig{}, fmt.Errorf("tcp harness: config %q: %w", config, err)
	}
	n, err := strconv.Atoi(v.Get("n"))
	if err != nil {
		return clusterConfig{}, fmt.Errorf("tcp harness: config %q: n: %w", config, err)
	}
	secret, err := hex.DecodeString(v.Get("secret"))
	if err != nil {
		return clusterConfig{}, fmt.Errorf("tcp harness: config %q: secret: %w", config, err)
	}
	return clusterConfig{dir: v.Get("dir"), n: n, secret: secret}, nil
}

func addrFile(dir string, id rdma.NodeID) string {
	return filepath.Join(dir, fmt.Sprintf("node-%d.addr", id))
}

func openNode(config string, id rdma.NodeID) (rdma.Node, error) {
	cfg, err := parseConfig(config)
	if err != nil {
		return nil, err
	}
	n, err := Open(id, Options{Listen: "127.0.0.1:0", Secret: cfg.secret})
	if err != nil {
		return nil, err
	}
	tmp := addrFile(cfg.dir, id) + fmt.Sprintf(".%d.tmp", os.Getpid())
	if err := os.WriteFile(tmp, []byte(n.Addr()), 0o644); err == nil {
		err = os.Rename(tmp, addrFile(cfg.dir, id))
	}
	if err != nil {
		n.Close()
		return nil, fmt.Errorf("tcp harness: publish address of node %d: %w", id, err)
	}
	return &rendezvousNode{Node: n, cfg: cfg}, nil
}

// rendezvousNode resolves peers through the cluster directory.
type rendezvousNode struct {
	*Node
	cfg clusterConfig
}

func (r *rendezvousNode) Connect(peer rdma.NodeID) (rdma.Conn, error) {
	if peer >= 1 && int(peer) <= r.cfg.n {
		deadline := time.Now().Add(resolveWait)
		for {
			b, err := os.ReadFile(addrFile(r.cfg.dir, peer))
			if err == nil {
				r.SetPeer(peer, string(b))
				break
			}
			if !errors.Is(err, os.ErrNotExist) || time.Now().After(deadline) {
				break // Connect reports the unknown peer
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return r.Node.Connect(peer)
}
