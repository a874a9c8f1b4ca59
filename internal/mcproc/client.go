package mcproc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/rdmakv/rdmakv/multicast"
	"github.com/rdmakv/rdmakv/multicast/tree"
)

// load is a client's running load.
type load struct {
	cr   *multicast.Client
	spec LoadSpec
	all  tree.Set
	em   *emitter

	stop     chan struct{} // no new calls
	stopOnce sync.Once
	hard     context.Context // ends the calls in progress
	abort    context.CancelFunc
	wg       sync.WaitGroup

	mu  sync.Mutex
	res LoadResult
}

func startLoad(cr *multicast.Client, spec LoadSpec, all tree.Set, em *emitter) *load {
	if spec.Workers <= 0 {
		spec.Workers = cr.Window()
	}
	if spec.PayloadSize <= 0 {
		spec.PayloadSize = 64
	}
	if spec.CallTimeout <= 0 {
		spec.CallTimeout = 30 * time.Second
	}
	l := &load{cr: cr, spec: spec, all: all, em: em, stop: make(chan struct{})}
	l.hard, l.abort = context.WithCancel(context.Background())
	for w := range spec.Workers {
		l.wg.Add(1)
		go l.worker(w)
	}
	return l
}

// dst draws a nonempty destination set.
func (l *load) dst(rng *rand.Rand) tree.Set {
	for {
		d := tree.Set(rng.Uint64N(uint64(l.all))+1) & l.all
		if d != 0 && (l.spec.MaxDst <= 0 || d.Len() <= l.spec.MaxDst) {
			return d
		}
	}
}

func (l *load) worker(w int) {
	defer l.wg.Done()
	rng := rand.New(rand.NewPCG(l.spec.Seed, uint64(w)+uint64(l.cr.Slot())<<32))
	for {
		select {
		case <-l.stop:
			return
		default:
		}
		dst := l.dst(rng)
		ids := make(chan multicast.MsgID, 1) // the id, once build ran (on the runner's goroutine)
		start := time.Now()
		ctx, cancel := context.WithTimeout(l.hard, l.spec.CallTimeout)
		o, err := l.cr.DoID(ctx, dst, func(id multicast.MsgID) []byte {
			ids <- id
			l.em.emitSync(Line{Multicast: &Sent{Msg: id, Dst: dst}}) // in the pipe before the message is written
			l.mu.Lock()
			l.res.Multicast++
			l.mu.Unlock()
			return Payload(id, l.spec.PayloadSize)
		})
		cancel()
		done := time.Now()
		if err != nil {
			var id multicast.MsgID
			select {
			case id = <-ids:
			default:
			}
			l.mu.Lock()
			l.res.Failed++
			l.mu.Unlock()
			l.em.emit(Line{Failure: &Failure{Msg: id, Dst: dst, Err: fmt.Sprintf("after %v: %v", done.Sub(start).Round(time.Millisecond), err), UnixNS: done.UnixNano()}})
			if l.hard.Err() != nil || errors.Is(err, multicast.ErrClosed) {
				return
			}
			continue
		}
		l.mu.Lock()
		l.res.Completed++
		if o.Retries > 0 {
			l.res.Retried++
			l.res.Retries += o.Retries
		}
		l.mu.Unlock()
		l.em.emit(Line{Outcome: &Outcome{Msg: o.ID, Dst: o.Dst, Replies: o.Replies, Retries: o.Retries, StartNS: start.UnixNano(), DoneNS: done.UnixNano()}})
	}
}

func (l *load) result() LoadResult {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.res
}

// end stops new calls and waits for the calls in progress (abort: ends
// them at once).
func (l *load) end(abort bool) LoadResult {
	l.stopOnce.Do(func() { close(l.stop) })
	if abort {
		l.abort()
	}
	l.wg.Wait()
	return l.result()
}

// serveClient runs a client process after its config line.
func serveClient(cfg Config, sc *bufio.Scanner, em *emitter) error {
	t, err := tree.Parse(cfg.Tree)
	if err != nil {
		return fmt.Errorf("mcproc: client: %w", err)
	}
	if int(cfg.Slot) >= len(cfg.ClientNodes) {
		return fmt.Errorf("mcproc: client slot %d: only %d slots", cfg.Slot, len(cfg.ClientNodes))
	}
	node, err := openNode(cfg, cfg.ClientNodes[cfg.Slot])
	if err != nil {
		return err
	}
	inc := uint64(time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	cr, err := multicast.StartClient(ctx, multicast.ClientConfig{Slot: cfg.Slot, Inc: inc, Tree: t, Members: cfg.Members,
		ClientSlots: cfg.ClientSlots, SlotSize: cfg.SlotSize, MaxResult: cfg.MaxResult, RetryAfter: cfg.RetryAfter,
		ReconnectMin: cfg.ReconnectMin, ReconnectMax: cfg.ReconnectMax}, node)
	cancel()
	if err != nil {
		node.Close()
		return fmt.Errorf("mcproc: client %d: %w", cfg.Slot, err)
	}
	em.emit(Line{Ready: true, Pid: os.Getpid(), ClientInc: inc})
	l := startLoad(cr, cfg.Load, t.All(), em)
	var stops sync.WaitGroup
	for sc.Scan() {
		var req Request
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			em.emit(Line{Err: fmt.Sprintf("bad request %q: %v", sc.Text(), err)})
			continue
		}
		switch req.Cmd {
		case CmdStatus:
			r := l.result()
			em.emit(Line{ID: req.ID, Load: &r})
		case CmdStopLoad:
			stops.Add(1)
			go func() {
				defer stops.Done()
				r := l.end(false)
				em.emit(Line{ID: req.ID, Load: &r})
			}()
		default:
			em.emit(Line{ID: req.ID, Err: fmt.Sprintf("client: unknown command %q", req.Cmd)})
		}
	}
	l.end(true)
	stops.Wait()
	cr.Close()
	return errors.Join(sc.Err(), node.Close())
}
