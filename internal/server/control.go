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
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/cluster"
)

// Control is a process's HTTP control port:
//
//	GET /status   JSON: the cluster's name, this process, each replica's state
//	GET /metrics  Prometheus text format
//	GET /healthz  200 while the process runs
//	GET /readyz   200 when every replica here has a leader and is caught up; 503 and why otherwise
//	GET /map      the cluster map clients use (JSON; never the secret)
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

// ServeControl serves the control port on ln (see StartControl).
func ServeControl(ln net.Listener, m *cluster.Map, reps []*Replica, withPprof bool, log *slog.Logger) *Control {
	start := time.Now()
	mux := http.NewServeMux()
	status := func() ProcessStatus {
		ps := ProcessStatus{Cluster: m.Name, Fabric: m.Fabric, Pid: os.Getpid(), Uptime: time.Since(start).Round(time.Second).String()}
		for _, r := range reps {
			ps.Replicas = append(ps.Replicas, r.Status())
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
		for _, rs := range status().Replicas {
			if ok, why := rs.Ready(); !ok {
				http.Error(w, fmt.Sprintf("not ready: replica %d (group %d): %s", rs.Node, rs.Group, why), http.StatusServiceUnavailable)
				return
			}
		}
		fmt.Fprintln(w, "ready")
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(NewRegistry(reps), promhttp.HandlerOpts{}))
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

// Watch logs each replica's role changes (elected, following, electing,
// catching up, snapshots restored) until ctx ends.
func Watch(ctx context.Context, reps []*Replica, log *slog.Logger) {
	type seen struct {
		role     string
		epoch    broadcast.Epoch
		catching bool
		restored uint64
		notReady string
	}
	last := make([]seen, len(reps))
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for first := true; ; first = false {
		for i, r := range reps {
			s := r.Status()
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
					if s.Role == "electing" {
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
