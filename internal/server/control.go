package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/client"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/kv"
	"github.com/rdmakv/rdmakv/rdma"
)

// Control is a process's HTTP control port:
//
//	GET /status   JSON: the cluster's name, this process, each replica's state
//	GET /metrics  Prometheus text format
//	GET /healthz  200 while the process runs
//	GET /readyz   200 when every replica here has a leader and is caught up; 503 and why otherwise
//	GET /map      the cluster map clients use (JSON; never the secret)
//	POST /force?group=G&epoch=E&count=C  force a leader of group G here (kvserver force-new-cluster)
//	GET /backup/<id>?group=G  the backup file of backup <id> (hex) a replica of group G here wrote (kvserver backup)
//	DELETE /backup/<id>  remove backup <id>'s files here, and write none later
//	/debug/pprof/ profiles, only with pprof enabled
type Control struct {
	srv *http.Server
	ln  net.Listener
	log *slog.Logger
}

// ProcessStatus is /status's answer.
type ProcessStatus struct {
	Cluster  string          `json:"cluster"`
	Fabric   string          `json:"fabric"`
	Pid      int             `json:"pid"`
	Uptime   string          `json:"uptime"`
	Replicas []ReplicaStatus `json:"replicas"`
	// Pollers are the process's pollers' counters (none for replicas run
	// outside a Process).
	Pollers []PollerStatus `json:"pollers,omitempty"`
	// SpareP is the pollers' spare P (none for replicas run outside a
	// Process).
	SpareP *SpareStatus `json:"spare_p,omitempty"`
	// Runtime is what the Go runtime's pauses and scheduling did to the
	// process's goroutines in the last 1 to 2 seconds.
	Runtime RuntimeStatus `json:"runtime"`
	// Balancer is the process's tablet balancer's state (absent: the
	// process runs none: no ordered keyspace, one group, or no replica
	// of group 0 here).
	Balancer *client.BalancerStatus `json:"balancer,omitempty"`
	// SharedLog is the process's one log (absent: each replica has a log
	// of its own, or memory mode): its batches and fsyncs, once; each
	// replica's disk status shows its stream's records and bytes.
	SharedLog *SharedLogStatus `json:"shared_log,omitempty"`
	// WALLayout is the durable modes' log layout in force: "per-replica"
	// (each replica a log of its own) or "shared" (shared_log). Absent
	// in memory mode and for replicas run outside a Process.
	WALLayout string `json:"wal_layout,omitempty"`
	// Start is how the process's start went (absent for replicas run
	// outside a Process).
	Start *StartStatus `json:"start,omitempty"`
}

// StartStatus is a Process's start in its phases (StartProcess): the
// replicas' nodes opened and prepared one after another, then every
// replica built (a durable one reads its snapshot and log and replays
// them: its recovery), then every replica handed to its poller (from
// there on the groups elect). The durations count from Began.
type StartStatus struct {
	Began time.Time `json:"began"` // StartProcess called
	// Opened: every node open and prepared; Built: every replica built
	// (recovered); Polled: every replica polled (0 while the start runs).
	OpenedSeconds float64 `json:"opened_seconds"`
	BuiltSeconds  float64 `json:"built_seconds"`
	PolledSeconds float64 `json:"polled_seconds"`
}

// StartControl listens on addr and serves the control port of the
// replicas reps of cluster map m.
func StartControl(addr string, m *cluster.Map, reps []*Replica, withPprof bool, log *slog.Logger) (*Control, error) {
	ln, err := ListenControl(addr)
	if err != nil {
		return nil, err
	}
	return ServeControl(ln, m, reps, withPprof, log), nil
}

// ListenControl binds the control port's address (before anything else
// starts, so that an address in use stops a process before it joins its
// group).
func ListenControl(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("control port: %w", err)
	}
	return ln, nil
}

// ControlOptions are ServeControlWith's options.
type ControlOptions struct {
	Pprof bool // serve /debug/pprof/
	// Secret is the cluster secret: POST /force then requires proof of
	// it (ForceAuthHeader). Without one the endpoint is as open as the
	// control port's address (127.0.0.1 by default).
	Secret []byte

	backups *backups // GET and DELETE /backup/<id> (StartProcess sets it)
	// balancer, if set, is the process's tablet balancer's state
	// (/status), and collector its metrics (StartProcess sets them).
	balancer  func() *client.BalancerStatus
	collector prometheus.Collector
	// start, if set, is the process's start (/status start).
	start func() StartStatus
	// sharedLog, if set, is the process's shared log's state (/status).
	sharedLog func() *SharedLogStatus
	// settings, if set, fills the process's settings in /status
	// (wal_layout, spare_p).
	settings func(*ProcessStatus)
}

// ServeControl serves the control port on ln (see StartControl).
func ServeControl(ln net.Listener, m *cluster.Map, reps []*Replica, withPprof bool, log *slog.Logger) *Control {
	return ServeControlWith(ln, m, reps, ControlOptions{Pprof: withPprof}, log)
}

// ServeControlWith is ServeControl with options.
func ServeControlWith(ln net.Listener, m *cluster.Map, reps []*Replica, o ControlOptions, log *slog.Logger) *Control {
	withPprof := o.Pprof
	start := time.Now()
	mux := http.NewServeMux()
	status := func() ProcessStatus {
		ps := ProcessStatus{Cluster: m.Name, Fabric: m.Fabric, Pid: os.Getpid(), Uptime: time.Since(start).Round(time.Second).String()}
		for _, r := range reps {
			ps.Replicas = append(ps.Replicas, r.Status())
		}
		// The spare P before the pollers: a poller clears its dense flag
		// before it gives the spare P back, so this order never shows a
		// returned spare P beside a poller still dense.
		ps.SpareP = spareStatus(reps)
		ps.Pollers = pollerStatus(reps)
		ps.Runtime = runtimeWindows.status()
		if o.balancer != nil {
			ps.Balancer = o.balancer()
		}
		if o.start != nil {
			x := o.start()
			ps.Start = &x
		}
		if o.sharedLog != nil {
			ps.SharedLog = o.sharedLog()
		}
		if o.settings != nil {
			o.settings(&ps)
		}
		return ps
	}
	writeJSON := func(w http.ResponseWriter, code int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(v)
	}
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, 200, status()) })
	mux.HandleFunc("GET /map", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, 200, m) })
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		for i, rs := range status().Replicas {
			if ok, why := rs.Ready(); !ok {
				if leaderLost(&rs) {
					if text, stuck := cannotElect(reps[i], &rs, m.Groups[rs.Group]); stuck {
						why = text
					}
				}
				http.Error(w, fmt.Sprintf("not ready: replica %d (group %d): %s", rs.Node, rs.Group, why), http.StatusServiceUnavailable)
				return
			}
		}
		fmt.Fprintln(w, "ready")
	})
	mux.HandleFunc("POST /force", func(w http.ResponseWriter, r *http.Request) {
		serveForce(w, r, reps, o.Secret, log)
	})
	mux.HandleFunc("GET /backup/{id}", func(w http.ResponseWriter, r *http.Request) { serveBackup(w, r, o.backups, o.Secret) })
	mux.HandleFunc("DELETE /backup/{id}", func(w http.ResponseWriter, r *http.Request) { serveBackup(w, r, o.backups, o.Secret) })
	reg := NewRegistry(reps)
	if o.collector != nil {
		reg.MustRegister(o.collector)
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	if withPprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	c := &Control{ln: ln, log: log, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}}
	go func() {
		if err := c.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("control port stopped", "err", err)
		}
	}()
	return c
}

// Addr is the address the control port listens on.
func (c *Control) Addr() string { return c.ln.Addr().String() }

// Close stops the control port, letting requests under way finish for up
// to a second.
func (c *Control) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return c.srv.Shutdown(ctx)
}

// watchEvery is how often a Process's Watch looks at its replicas: a
// third of the election timeout (a role, or the lost leader before an
// election, lasts about one), between 20 ms (Watch's own tick) and
// 50 ms. Each look wakes the process (a timer, the Go scheduler's
// threads, sysmon): at 20 ms an idle embedded kvserver (150 ms election
// timeout) made ~1100 context switches a second, at 50 ms ~870, and its
// CPU fell from ~5.6% to ~4.3% of a core (issue 17, under load).
func watchEvery(et time.Duration) time.Duration {
	return min(max(et/3, 20*time.Millisecond), 50*time.Millisecond)
}

// Watch logs each replica's role changes (elected, following, electing,
// catching up, snapshots restored) until ctx ends, looking every 20 ms.
func Watch(ctx context.Context, reps []*Replica, log *slog.Logger) {
	watch(ctx, reps, log, 20*time.Millisecond)
}

func watch(ctx context.Context, reps []*Replica, log *slog.Logger, every time.Duration) {
	type seen struct {
		role     string
		epoch    broadcast.Epoch
		catching bool
		restored uint64
		notReady string
	}
	last := make([]seen, len(reps))
	t := time.NewTicker(every)
	defer t.Stop()
	for first := true; ; first = false {
		for i, r := range reps {
			s := r.watchStatus()
			_, why := s.Ready()
			now := seen{s.Role, s.Epoch, s.CatchingUp, s.Counters.SnapshotsRestored, why}
			if first || now != last[i] {
				lg := log.With("group", s.Group, "node", s.Node)
				switch {
				case now.restored != last[i].restored && !first:
					lg.Info("restored a snapshot from the leader", "records", s.Records, "applied", s.Applied)
				case now.catching && !last[i].catching:
					lg.Info("catching up with the group", "epoch", s.Epoch.String())
				case now.role != last[i].role || now.epoch != last[i].epoch:
					if s.Role == "electing" && first {
						// A replica that starts has no leader yet: its
						// first election is the normal start, not a loss.
						lg.Info("electing a leader", "last_epoch", s.Epoch.String())
					} else if s.Role == "electing" {
						lg.Warn("no leader: electing", "last_epoch", s.Epoch.String())
					} else {
						lg.Info("role", "role", s.Role, "epoch", s.Epoch.String(), "leader", s.Leader)
					}
				case now.notReady != last[i].notReady && now.notReady != "":
					lg.Warn("not ready: " + now.notReady)
				case now.notReady != last[i].notReady:
					lg.Info("ready", "role", s.Role, "epoch", s.Epoch.String(), "leader", s.Leader)
				}
				last[i] = now
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// leaderLost reports whether s has no leader, or follows one it cannot
// reach (Ready's first two reasons).
func leaderLost(s *ReplicaStatus) bool {
	if s.Leader == 0 {
		return true
	}
	for _, m := range s.Members {
		if m.Node == s.Leader {
			return m.State == "unreachable" || m.State == "unknown"
		}
	}
	return false
}

// readyzPeerTimeout bounds /readyz's read of each other member's header,
// readyzPeerWait its wait for all of them (connecting included).
const (
	readyzPeerTimeout = 300 * time.Millisecond
	readyzPeerWait    = time.Second
)

// cannotElect says, for /readyz, why replica p's group (members) cannot
// elect a leader, if it cannot: fewer than a majority of its members are
// voters, reachable and not catching up (a member that restarted without
// its data cannot vote until a leader catches it up). p's own state is s;
// the others' is what their kv table headers say (read one-sided, as
// clients read them). A member whose header says it serves leads: its
// group is not stuck.
func cannotElect(p *Replica, s *ReplicaStatus, members []rdma.NodeID) (string, bool) {
	type peer struct {
		id        rdma.NodeID
		reachable bool
		hdr       kv.Header
	}
	peers := make([]peer, 0, len(members))
	for _, id := range members {
		if id != s.Node {
			peers = append(peers, peer{id: id})
		}
	}
	// Read in parallel; a member that has not answered within
	// readyzPeerWait (a tcp Connect may take its peer timeout) counts
	// as unreachable, and its late answer is dropped.
	node := p.r.Table().Node()
	type answer struct {
		i   int
		hdr kv.Header
		ok  bool
	}
	answers := make(chan answer, len(peers))
	for i := range peers {
		go func() {
			a := answer{i: i}
			if conn, err := node.Connect(peers[i].id); err == nil {
				a.hdr, err = kv.ReadHeader(conn, uint32(s.Group), readyzPeerTimeout)
				a.ok = err == nil
				conn.Close()
			}
			answers <- a
		}()
	}
	wait := time.NewTimer(readyzPeerWait)
	defer wait.Stop()
collect:
	for range peers {
		select {
		case a := <-answers:
			peers[a.i].hdr, peers[a.i].reachable = a.hdr, a.ok
		case <-wait.C:
			break collect
		}
	}
	var down, catching []rdma.NodeID
	voters := 0
	if s.CatchingUp {
		catching = append(catching, s.Node)
	} else {
		voters++
	}
	for _, q := range peers {
		switch {
		case !q.reachable:
			down = append(down, q.id)
		case q.hdr.Serving != 0:
			return "", false
		case q.hdr.CatchingUp:
			catching = append(catching, q.id)
		default:
			voters++
		}
	}
	if voters >= len(members)/2+1 {
		return "", false
	}
	slices.Sort(catching)
	text := fmt.Sprintf("group %d cannot elect a leader: ", s.Group)
	if len(down) > 0 {
		text += nodeList(down) + " unreachable"
		if len(catching) > 0 {
			text += "; "
		}
	}
	switch {
	case len(catching) == 1:
		text += nodeList(catching) + " restarted without its data and cannot vote"
	case len(catching) > 1:
		text += nodeList(catching) + " restarted without their data and cannot vote"
	}
	switch {
	case len(catching) == 0:
	case voters == 0:
		text += ` (see docs/deploy.md "When a whole group is down")`
	default:
		text += ` (see docs/deploy.md "force-new-cluster")`
	}
	return text, true
}

// nodeList is "replica 2", "replicas 2 and 3", "replicas 1, 2 and 3".
func nodeList(ids []rdma.NodeID) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = fmt.Sprint(id)
	}
	if len(s) == 1 {
		return "replica " + s[0]
	}
	return "replicas " + strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

// serveForce is POST /force?group=G&epoch=E&count=C: the first
// state-changing request of the control port. It runs ForceLead on this
// process's replica of group G with (E, C) as the accepted header its
// status showed (so that a group that moved since refuses), and answers
// 200 with the forced epoch, 409 with the refusal's reason, 403 without
// proof of the cluster secret (when there is one), 400/404 for a bad
// request.
func serveForce(w http.ResponseWriter, r *http.Request, reps []*Replica, secret []byte, log *slog.Logger) {
	q := r.URL.Query()
	g, err1 := strconv.Atoi(q.Get("group"))
	e, err2 := strconv.ParseUint(q.Get("epoch"), 10, 64)
	cnt, err3 := strconv.ParseUint(q.Get("count"), 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		http.Error(w, "force: want ?group=G&epoch=E&count=C (E, C: the replica's accepted header in /status, numbers)", http.StatusBadRequest)
		return
	}
	h := Hdr{Epoch: broadcast.Epoch(e), Count: cnt}
	if len(secret) > 0 && !checkForceAuth(secret, g, h, r.Header.Get(ForceAuthHeader)) {
		http.Error(w, "force: the cluster has a secret: send its proof in "+ForceAuthHeader+" (kvserver force-new-cluster --config does)", http.StatusForbidden)
		return
	}
	for _, rep := range reps {
		if rep.Group != g {
			continue
		}
		got, err := rep.ForceLead(broadcast.MsgHdr{E: h.Epoch, Cnt: h.Count})
		switch {
		case errors.Is(err, broadcast.ErrForceRefused):
			http.Error(w, err.Error(), http.StatusConflict)
		case err != nil:
			http.Error(w, "force: "+err.Error(), http.StatusInternalServerError)
		default:
			log.Warn("forced vote: an operator forced this replica to lead its group; members catching up join it and take its data", "group", g, "node", rep.Node, "epoch", got.String())
			fmt.Fprintf(w, "node %d of group %d votes for itself in epoch %v (%d), forced\n", rep.Node, g, got, uint64(got))
		}
		return
	}
	http.Error(w, fmt.Sprintf("force: no replica of group %d in this process", g), http.StatusNotFound)
}
