package rdma

import (
	"sync"
	"time"
)

// DefaultQueueDepth is the default bound on a Conn's outstanding ops and
// unpolled completions.
const DefaultQueueDepth = 4096

// CQ is a bounded completion queue shared by a producer (the fabric) and the
// Conn's user. Fabrics embed it; it allocates nothing after NewCQ.
type CQ struct {
	mu     sync.Mutex
	buf    []Completion
	head   int
	n      int
	signal chan struct{}
	db     Doorbell // rung on Push when set: asynchronous completions wake a parked node
}

// NewCQ returns a queue holding up to depth completions; db, if not nil, is
// rung on every Push.
func NewCQ(depth int, db Doorbell) *CQ {
	if depth <= 0 {
		depth = DefaultQueueDepth
	}
	return &CQ{buf: make([]Completion, depth), signal: make(chan struct{}, 1), db: db}
}

// Full reports whether a Push would fail.
func (q *CQ) Full() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n == len(q.buf)
}

// Len is the number of completions waiting to be polled.
func (q *CQ) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}

// Push appends c; it returns false (dropping c) when the queue is full.
func (q *CQ) Push(c Completion) bool {
	q.mu.Lock()
	if q.n == len(q.buf) {
		q.mu.Unlock()
		return false
	}
	q.buf[(q.head+q.n)%len(q.buf)] = c
	q.n++
	q.mu.Unlock()
	select {
	case q.signal <- struct{}{}:
	default:
	}
	if q.db != nil {
		q.db.Ring()
	}
	return true
}

// Poll moves up to len(cs) completions into cs.
func (q *CQ) Poll(cs []Completion) int {
	q.mu.Lock()
	k := 0
	for k < len(cs) && q.n > 0 {
		cs[k] = q.buf[q.head]
		q.buf[q.head] = Completion{}
		q.head = (q.head + 1) % len(q.buf)
		q.n--
		k++
	}
	q.mu.Unlock()
	return k
}

// Wait polls, blocking up to timeout for a first completion.
func (q *CQ) Wait(cs []Completion, timeout time.Duration) int {
	if n := q.Poll(cs); n > 0 || timeout <= 0 {
		return n
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case <-q.signal:
			if n := q.Poll(cs); n > 0 {
				return n
			}
		case <-t.C:
			return q.Poll(cs)
		}
	}
}
