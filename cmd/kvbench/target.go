package main

import (
	"errors"
	"fmt"
	"net"
	"sync/atomic"

	"github.com/rdmakv/rdmakv/rdma"
)

// target is the passive end of every measurement: it echoes ping-pongs,
// owns the region the initiator reads, consumes the ring, and serves the
// raw baselines. It runs one measurement at a time, in a goroutine started
// by a request and ended by "stop".
type target struct {
	node rdma.Node
	conn rdma.Conn // to the initiator, node initiatorID
	ww   *wordWriter
	park bool

	regions []rdma.Region // of the running measurement
	stop    atomic.Bool
	done    chan result
	cleanup []func() error // of the running measurement
}

// result is what a target's measurement goroutine reports.
type result struct {
	seen, bad uint64
	err       error
}

// Node ids of the two ends of a fabric measurement.
const (
	initiatorID rdma.NodeID = 1
	targetID    rdma.NodeID = 2
)

func (t *target) handle(req request) reply {
	var err error
	var r reply
	switch req.Cmd {
	case "open":
		r.Addr, err = t.open(req.Cluster)
	case "pingpong", "passive", "ring":
		err = t.startFabric(req)
	case "raw-shm", "raw-futex", "raw-ring":
		err = t.startRawShm(req)
	case "raw-tcp", "raw-stream":
		err = t.startRawTCP(req)
	case "stop":
		res := t.stopRunning()
		r.Seen, r.Bad, err = res.seen, res.bad, res.err
	default:
		err = fmt.Errorf("unknown command %q", req.Cmd)
	}
	if err != nil {
		r.Err = err.Error()
	}
	return r
}

// open opens the target's fabric node in this process and connects it to
// the initiator.
func (t *target) open(cfg *clusterConfig) (string, error) {
	if cfg == nil {
		return "", errors.New("open: no cluster configuration")
	}
	if t.node != nil {
		return "", errors.New("open: node already open")
	}
	n, addr, err := openNode(cfg, targetID)
	if err != nil {
		return "", err
	}
	c, err := n.Connect(initiatorID)
	if err != nil {
		n.Close()
		return "", fmt.Errorf("connect to node %d: %w", initiatorID, err)
	}
	t.node, t.conn, t.ww, t.park = n, c, &wordWriter{c: c}, cfg.Mode == "park"
	return addr, nil
}

// register creates a region of the running measurement, open to the
// initiator.
func (t *target) register(k, role, size int) (rdma.Region, error) {
	r, err := t.node.Register(regionID(k, role), size)
	if err != nil {
		return nil, fmt.Errorf("register region %d: %w", regionID(k, role), err)
	}
	t.regions = append(t.regions, r)
	if err := r.Grant(initiatorID, rdma.PermReadWrite); err != nil {
		return nil, fmt.Errorf("grant region %d: %w", regionID(k, role), err)
	}
	return r, nil
}

func (t *target) startFabric(req request) error {
	if t.node == nil {
		return errors.New("no fabric node open")
	}
	if t.done != nil {
		return errors.New("a measurement is running")
	}
	w := &waiter{park: t.park, db: t.node.Doorbell(), stop: &t.stop}
	var run func() result
	switch req.Cmd {
	case "pingpong":
		r, err := t.register(req.K, regPingPong, pingPongSize)
		if err != nil {
			return err
		}
		run = func() result { return echoPingPong(t.ww, w, r.Bytes(), regionID(req.K, regPingPong)) }
	case "passive":
		if _, err := t.register(req.K, regPingPong, pingPongSize); err != nil {
			return err
		}
		run = func() result { return result{} } // reads need no target CPU
	case "ring":
		if req.Size < minSlotSize || req.Size%8 != 0 || req.Slots <= 0 {
			return fmt.Errorf("ring: bad shape %d slots of %d bytes", req.Slots, req.Size)
		}
		r, err := t.register(req.K, regRing, ringSize(req.Slots, req.Size))
		if err != nil {
			return err
		}
		ww := t.ww
		var flags rdma.Flags
		if t.park {
			flags = rdma.Notify
		}
		credits := regionID(req.K, regCredits)
		run = func() result {
			return consumeRing(w, r.Bytes(), req.Slots, req.Size, func(head uint64) error {
				return ww.write(credits, 0, head, flags)
			})
		}
	}
	t.launch(run)
	return nil
}

// launch runs the measurement's goroutine.
func (t *target) launch(run func() result) {
	t.stop.Store(false)
	t.done = make(chan result, 1)
	go func() { t.done <- run() }()
}

// stopRunning ends the running measurement and releases its resources.
func (t *target) stopRunning() result {
	var res result
	if t.done != nil {
		t.stop.Store(true)
		if t.node != nil {
			t.node.Doorbell().Ring()
		}
		res = <-t.done
		t.done = nil
		if errors.Is(res.err, errStopped) {
			res.err = nil
		}
	}
	for _, r := range t.regions {
		if err := r.Close(); err != nil && res.err == nil {
			res.err = err
		}
	}
	t.regions = nil
	for _, f := range t.cleanup {
		if err := f(); err != nil && res.err == nil {
			res.err = err
		}
	}
	t.cleanup = nil
	return res
}

// shutdown stops everything and closes the node.
func (t *target) shutdown() error {
	res := t.stopRunning()
	if t.conn != nil {
		t.conn.Close()
	}
	if t.node != nil {
		if err := t.node.Close(); err != nil && res.err == nil {
			res.err = err
		}
		t.node = nil
	}
	return res.err
}

// echoPingPong answers ping-pongs: when its word holds the next sequence
// number, it writes that number into the initiator's word.
func echoPingPong(ww *wordWriter, w *waiter, mine []byte, peerRegion rdma.RegionID) result {
	var flags rdma.Flags
	if w.park {
		flags = rdma.Notify
	}
	var res result
	for want := uint64(1); ; want++ {
		if err := w.until(func() bool { return rdma.Load64(mine, 0) == want }); err != nil {
			res.err = err
			return res
		}
		if err := ww.write(peerRegion, 0, want, flags); err != nil {
			res.err = fmt.Errorf("pingpong echo %d: %w", want, err)
			return res
		}
		res.seen++
	}
}

// consumeRing drains a ring (layout in layout.go): it waits for tail to
// move, validates every new slot and returns credits with give(head).
func consumeRing(w *waiter, ring []byte, slots, size int, give func(head uint64) error) result {
	var res result
	var head, tail uint64
	for {
		if err := w.until(func() bool { tail = rdma.Load64(ring, 0); return tail != head }); err != nil {
			res.err = err
			return res
		}
		if tail-head > uint64(slots) {
			res.err = fmt.Errorf("ring: tail %d is more than %d slots past head %d", tail, slots, head)
			return res
		}
		for m := head; m < tail; m++ {
			first, last := decodeSlot(ring, slotOffset(m, slots, size), size)
			if first != m+1 || last != m+1 {
				res.bad++
			}
		}
		res.seen += tail - head
		head = tail
		if err := give(head); err != nil {
			res.err = fmt.Errorf("ring credits %d: %w", head, err)
			return res
		}
	}
}

// startRawTCP serves a raw TCP baseline: an 8-byte echo (raw-tcp) or a
// sink counting messages of req.Size bytes (raw-stream).
func (t *target) startRawTCP(req request) error {
	if t.done != nil {
		return errors.New("a measurement is running")
	}
	c, err := net.Dial("tcp", req.Addr)
	if err != nil {
		return fmt.Errorf("dial %s: %w", req.Addr, err)
	}
	tc := c.(*net.TCPConn)
	tc.SetNoDelay(true)
	t.cleanup = append(t.cleanup, c.Close)
	if req.Cmd == "raw-tcp" {
		t.launch(func() result { return tcpEcho(tc) })
	} else {
		t.launch(func() result { return tcpSink(tc, req.Size) })
	}
	return nil
}
