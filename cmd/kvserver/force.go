package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/rdmakv/rdmakv/broadcast"
	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/internal/server"
)

const forceUsage = `usage: kvserver force-new-cluster --config FILE --group G [--from ID] [--yes] [--timeout D]

A group whose majority restarted without its data (memory mode) cannot
elect a leader: restarted replicas may not vote until a leader catches
them up. This makes a replica that kept its data lead, and the others
take its data. It reads /status of group G's replicas, picks the
reachable replica that kept its data with the largest accepted header
(or --from), and says what it would do and what that may lose. With
--yes it does it (POST /force on that replica's control port) and waits
until a majority of the group is ready. It refuses if the group has a
leader, if no majority answers, or if the chosen replica is not
electing. See docs/deploy.md, "When a whole group is down".

`

// forceMember is one replica of the group, as force-new-cluster sees it.
type forceMember struct {
	id      int64
	control string
	st      *server.ReplicaStatus
	err     error
}

func runForce(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kvserver force-new-cluster", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, forceUsage)
		fs.PrintDefaults()
	}
	config := fs.String("config", "", "the cluster config (TOML)")
	group := fs.Int("group", -1, "the group to force (its index, as /status shows it)")
	from := fs.Int64("from", 0, "the replica to go on from (default: the reachable one that kept its data with the largest accepted header)")
	yes := fs.Bool("yes", false, "do it (without: only say what it would do)")
	timeout := fs.Duration("timeout", time.Minute, "how long to wait for a majority of the group to be ready after the force")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *config == "" || *group < 0 || fs.NArg() > 0 {
		fs.Usage()
		return 2
	}
	cfg, err := cluster.LoadConfig(*config)
	if err != nil {
		fmt.Fprintf(stderr, "kvserver: %v\n", err)
		return 2
	}
	if *group >= len(cfg.Groups) {
		fmt.Fprintf(stderr, "kvserver: force-new-cluster: no group %d in %s (it has %s)\n", *group, *config, plural(len(cfg.Groups), "group"))
		return 2
	}
	g := *group
	hc := &http.Client{Timeout: 2 * time.Second}
	refuse := func(format string, args ...any) int {
		fmt.Fprintf(stderr, "kvserver: force-new-cluster: "+format+"\n", args...)
		return 1
	}

	var mems []*forceMember
	up := 0
	for _, r := range cfg.Groups[g].Replicas {
		fm := &forceMember{id: r.ID, control: r.Control}
		fm.st, fm.err = replicaStatus(hc, r.Control, g, r.ID)
		if fm.err == nil {
			up++
		}
		mems = append(mems, fm)
	}
	n, quorum := len(mems), len(mems)/2+1
	if up < quorum {
		var why []string
		for _, fm := range mems {
			if fm.err != nil {
				why = append(why, fmt.Sprintf("node %d: %v", fm.id, fm.err))
			}
		}
		return refuse("group %d: only %d of %d replicas answer (%s): a forced leader needs a majority up; start the others (they come back catching up) and run this again", g, up, n, strings.Join(why, "; "))
	}
	for _, fm := range mems {
		if fm.st != nil && fm.st.Leader != 0 {
			return refuse("group %d has a leader: node %d says it follows node %d in epoch %v; nothing to force", g, fm.id, fm.st.Leader, fm.st.Epoch)
		}
	}
	var s *forceMember
	for _, fm := range mems {
		switch {
		case fm.st == nil || fm.st.CatchingUp:
		case *from != 0 && fm.id == *from:
			s = fm
		case *from == 0 && (s == nil || hdrLess(s.st.Accepted, fm.st.Accepted)):
			s = fm
		}
	}
	if s == nil {
		if *from != 0 {
			return refuse("group %d: node %d is not a reachable replica of the group that kept its data", g, *from)
		}
		return refuse("group %d: every reachable replica restarted without its data: there is nothing to go on from (the group's data is lost; restart its replicas with an empty data_dir to begin anew)", g)
	}
	if s.st.Role != broadcast.Electing.String() {
		return refuse("group %d: node %d is %s, not electing", g, s.id, s.st.Role)
	}
	var catching []string
	for _, fm := range mems {
		if fm.st != nil && fm.st.CatchingUp {
			catching = append(catching, fmt.Sprint(fm.id))
		}
	}
	takers := "No member catching up answers; those that come back"
	switch len(catching) {
	case 0:
	case 1:
		takers = "Member " + catching[0]
	default:
		takers = "Members " + strings.Join(catching[:len(catching)-1], ", ") + " and " + catching[len(catching)-1]
	}
	fmt.Fprintf(stdout, "group %d will go on from node %d (accepted %v, committed index %d). Writes the old leader committed after that point, if any, are lost: at most %d entries (the leader's uncommitted window, if node %d kept up with it). %s will take node %d's data.\n",
		g, s.id, s.st.Accepted, s.st.Delivered, broadcast.DefaultMaxUncommitted, s.id, takers, s.id)
	if !*yes {
		fmt.Fprintln(stdout, "Nothing done: add --yes to do it.")
		return 0
	}
	q := url.Values{"group": {fmt.Sprint(g)}, "epoch": {fmt.Sprint(uint64(s.st.Accepted.Epoch))}, "count": {fmt.Sprint(s.st.Accepted.Count)}}
	req, err := http.NewRequest(http.MethodPost, "http://"+s.control+"/force?"+q.Encode(), nil)
	if err != nil {
		return refuse("%v", err)
	}
	if len(cfg.SecretBytes) > 0 {
		req.Header.Set(server.ForceAuthHeader, server.ForceAuth(cfg.SecretBytes, g, s.st.Accepted))
	}
	resp, err := hc.Do(req)
	if err != nil {
		return refuse("node %d: %v", s.id, err)
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return refuse("node %d refused: %s", s.id, strings.TrimSpace(string(body)))
	}
	fmt.Fprintf(stdout, "forced: %s", body)
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	last := time.Time{}
	for {
		var ready []string
		var not []string
		for _, fm := range mems {
			ok, why := replicaReady(hc, fm.control)
			if ok {
				ready = append(ready, fmt.Sprint(fm.id))
			} else {
				not = append(not, fmt.Sprintf("node %d: %s", fm.id, why))
			}
		}
		if len(ready) >= quorum {
			fmt.Fprintf(stdout, "group %d serves again: replicas %s are ready.\n", g, strings.Join(ready, ", "))
			return 0
		}
		if time.Since(last) >= time.Second {
			last = time.Now()
			fmt.Fprintf(stdout, "waiting for group %d: %d of %d replicas ready (%s)\n", g, len(ready), n, strings.Join(not, "; "))
		}
		select {
		case <-ctx.Done():
			return refuse("group %d: a majority was not ready within --timeout %v (%s)", g, *timeout, strings.Join(not, "; "))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// hdrLess orders headers as broadcast.MsgHdr.Less does.
func hdrLess(a, b server.Hdr) bool {
	return a.Epoch < b.Epoch || a.Epoch == b.Epoch && a.Count < b.Count
}

// replicaStatus reads replica id of group g from /status at control.
func replicaStatus(hc *http.Client, control string, g int, id int64) (*server.ReplicaStatus, error) {
	if control == "" {
		return nil, errors.New("no control port in the config")
	}
	resp, err := hc.Get("http://" + control + "/status")
	if err != nil {
		return nil, fmt.Errorf("unreachable (%v)", err)
	}
	defer resp.Body.Close()
	var ps server.ProcessStatus
	if err := json.NewDecoder(resp.Body).Decode(&ps); err != nil {
		return nil, fmt.Errorf("/status: %v", err)
	}
	for i := range ps.Replicas {
		if r := &ps.Replicas[i]; r.Group == g && int64(r.Node) == id {
			return r, nil
		}
	}
	return nil, fmt.Errorf("%s serves no replica %d of group %d", control, id, g)
}

// replicaReady asks /readyz at control.
func replicaReady(hc *http.Client, control string) (bool, string) {
	if control == "" {
		return false, "no control port"
	}
	resp, err := hc.Get("http://" + control + "/readyz")
	if err != nil {
		return false, "unreachable"
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return resp.StatusCode == http.StatusOK, strings.TrimSpace(string(b))
}
