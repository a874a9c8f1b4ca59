package wal

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/internal/vfs"
)

// BenchmarkMuxAsyncGetters: what a process's pollers ask the shared log
// for, as Async replicas do (broadcast's diskLate at every ring record
// reads OldestUnsynced and UnsyncedBytes; a Poll reads Synced, NextSeq,
// Err and Full), while another goroutine appends records and polls the
// log as a replica's writes do. Two pollers of three streams each; an op
// is one pass of one poller over its streams' getters. The log runs on a
// FileDevice over vfs.Mem (its goroutine continues and kicks as the
// shared log's).
func BenchmarkMuxAsyncGetters(b *testing.B) {
	var mp atomic.Pointer[Mux]
	dev := NewFileDevice(vfs.NewMem(), func() {
		if m := mp.Load(); m != nil {
			m.Continue(0)
		}
	})
	defer dev.Close()
	m, err := OpenMux(dev, Config{Dir: testDir, Member: testMuxMember, Mode: Async, FsyncInterval: time.Millisecond, SegmentBytes: 64 << 20}, nil)
	if err != nil {
		b.Fatal(err)
	}
	mp.Store(m)
	streams := make([]*Stream, 6)
	for i := range streams {
		streams[i] = m.Stream(uint32(i+1), nil)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the writing replica
		defer wg.Done()
		p := make([]byte, 512)
		start := time.Now()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			s := streams[i%len(streams)]
			if s.UnsyncedBytes() < 1<<20 {
				p[0] = byte(i)
				s.Append(RecEntry, p)
			}
			s.Poll(time.Since(start))
		}
	}()
	b.ResetTimer()
	var pw sync.WaitGroup
	n := b.N / 2
	for g := range 2 {
		pw.Add(1)
		go func() {
			defer pw.Done()
			mine := streams[3*g : 3*g+3]
			sink := 0
			for range n {
				for _, s := range mine {
					if s.OldestUnsynced() >= 0 && s.UnsyncedBytes() > 0 {
						sink++
					}
					if s.Err() == nil && !s.Full() && s.Synced() < s.NextSeq() {
						sink++
					}
				}
			}
			_ = sink
		}()
	}
	pw.Wait()
	b.StopTimer()
	close(stop)
	wg.Wait()
}
