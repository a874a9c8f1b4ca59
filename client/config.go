package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"syscall"

	"github.com/rdmakv/rdmakv/cluster"
	"github.com/rdmakv/rdmakv/fabric"
	"github.com/rdmakv/rdmakv/rdma"
)

// WithConfigFile connects with a cluster's config, the TOML file its
// kvserver processes run from: the map it describes and, on tcp, its
// cluster secret. A tcp client then takes the first of the config's client
// slots whose address it can listen on (one on this host not in use).
func WithConfigFile(path string) Option { return func(o *options) { o.configFile = path } }

// WithSeed fetches the cluster map from a replica's control port
// (host:port, its /map). The map holds no secret: a tcp client also needs
// WithTCP or WithSecret.
func WithSeed(controlAddr string) Option { return func(o *options) { o.seed = controlAddr } }

// WithSecret sets the cluster secret of a tcp client (the slot, and so
// the listen address, is claimed as with WithConfigFile).
func WithSecret(secret []byte) Option { return func(o *options) { o.secret = secret } }

// maxMapBytes bounds a map fetched from a seed.
const maxMapBytes = 4 << 20

// loadRemote loads the map from the config file or the seed.
func loadRemote(ctx context.Context, o *options) (*cluster.Map, error) {
	if o.configFile != "" {
		cfg, err := cluster.LoadConfig(o.configFile)
		if err != nil {
			return nil, err
		}
		if o.secret == nil {
			o.secret = cfg.SecretBytes
		}
		return cfg.Map()
	}
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+o.seed+"/map", nil)
	if err != nil {
		return nil, fmt.Errorf("seed %q: %w", o.seed, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, &seedError{seed: o.seed, err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("seed %s: GET /map: %s", o.seed, resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxMapBytes+1))
	if err != nil {
		return nil, fmt.Errorf("seed %s: %w", o.seed, err)
	}
	if len(b) > maxMapBytes {
		return nil, fmt.Errorf("seed %s: a map of more than %d bytes", o.seed, maxMapBytes)
	}
	var m cluster.Map
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("seed %s: %w: %v", o.seed, cluster.ErrInvalid, err)
	}
	if err := m.Fill(); err != nil {
		return nil, fmt.Errorf("seed %s: %w", o.seed, err)
	}
	return &m, nil
}

// claimTCPSlot opens the node of the first client slot whose address this
// host can listen on: a slot of another host fails with "cannot assign
// requested address", one in use on this host with "address in use".
func claimTCPSlot(m *cluster.Map, secret []byte) (int, rdma.Node, error) {
	if len(secret) == 0 {
		return 0, nil, errors.New("a tcp cluster needs its secret (WithConfigFile, WithSecret or WithTCP)")
	}
	inUse := 0
	s := fabric.ForMap(m)
	s.Secret = secret
	for k, id := range m.ClientNodes {
		n, err := fabric.Open(s, id)
		if err == nil {
			return k, n, nil
		}
		switch {
		case errors.Is(err, syscall.EADDRINUSE):
			inUse++
		case errors.Is(err, syscall.EADDRNOTAVAIL):
		default:
			return 0, nil, fmt.Errorf("client slot %d (%s): %w", k, m.Addrs[id], err)
		}
	}
	if inUse == 0 {
		return 0, nil, fmt.Errorf("none of the %d client slots' addresses is on this host: add a [[clients]] block listening here to the cluster's config", len(m.ClientNodes))
	}
	return 0, nil, fmt.Errorf("all %d client slots of this host are in use", inUse)
}

// seedError: the seed's control port did not answer (the cluster, or this
// replica of it, is unavailable).
type seedError struct {
	seed string
	err  error
}

func (e *seedError) Error() string { return fmt.Sprintf("seed %s unreachable: %v", e.seed, e.err) }

func (e *seedError) Unwrap() []error { return []error{ErrUnavailable, e.err} }
