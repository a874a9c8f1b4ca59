package server_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/localcluster"
	"github.com/rdmakv/rdmakv/internal/server"
	"github.com/rdmakv/rdmakv/rdma"
)

func post(t *testing.T, url string, hdr map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestForceEndpointAuth: POST /force, the control port's one request that
// changes state, needs the proof of the cluster secret when there is one
// (an HMAC bound to the group and epoch: a proof for another command does
// not do), checks its parameters, and is POST only. The embedded
// cluster's replicas take no commands: an authorised request says so.
func TestForceEndpointAuth(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := &cluster.Map{Name: "force", Fabric: "mem", Groups: [][]rdma.NodeID{{1, 2, 3}}, ClientNodes: []rdma.NodeID{100}}
	lc, err := localcluster.Start(ctx, m, broadcast.Config{HeartbeatInterval: time.Millisecond, ElectionTimeout: 30 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	secret := []byte("0123456789abcdef0123")
	c := server.ServeControlWith(ln, m, lc.Replicas()[:1], server.ControlOptions{Secret: secret}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer c.Close()
	base := "http://" + c.Addr()
	auth := func(g int, e uint64) map[string]string {
		return map[string]string{server.ForceAuthHeader: server.ForceAuth(secret, g, server.Hdr{Epoch: broadcast.Epoch(e), Count: 3})}
	}
	for _, tc := range []struct {
		name, query string
		hdr         map[string]string
		code        int
		want        string
	}{
		{"no proof", "group=0&epoch=7&count=3", nil, http.StatusForbidden, "send its proof"},
		{"proof of another command", "group=0&epoch=7&count=3", auth(0, 8), http.StatusForbidden, "send its proof"},
		{"proof of another count", "group=0&epoch=7&count=4", auth(0, 7), http.StatusForbidden, "send its proof"},
		{"proof with another secret", "group=0&epoch=7&count=3", map[string]string{server.ForceAuthHeader: server.ForceAuth([]byte("another secret, 20b"), 0, server.Hdr{Epoch: 7, Count: 3})}, http.StatusForbidden, "send its proof"},
		{"bad parameters", "group=x&epoch=7&count=3", auth(0, 7), http.StatusBadRequest, "want ?group=G&epoch=E&count=C"},
		{"no such group here", "group=3&epoch=7&count=3", auth(3, 7), http.StatusNotFound, "no replica of group 3"},
		{"embedded replica", "group=0&epoch=7&count=3", auth(0, 7), http.StatusInternalServerError, "takes no commands"},
	} {
		code, body := post(t, base+"/force?"+tc.query, tc.hdr)
		if code != tc.code || !strings.Contains(body, tc.want) {
			t.Errorf("%s: POST /force?%s: %d %q, want %d and %q", tc.name, tc.query, code, body, tc.code, tc.want)
		}
	}
	if code, _ := get(t, base+"/force?group=0&epoch=7&count=3"); code != http.StatusMethodNotAllowed {
		t.Errorf("GET /force: %d, want 405", code)
	}
}
