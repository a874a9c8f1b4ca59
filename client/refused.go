package client

import (
	"errors"
	"fmt"

	"github.com/rdmakv/rdmakv/kv"
)

// ErrRefused is wrapped by *LimitError: the replicas refused a write that
// breaks one of their limits, and applied nothing of it.
var ErrRefused = errors.New("rdmakv: refused by the replicas")

// LimitError says which limit of the replicas a write broke. The replicas
// enforce their own config's limits, which may be stricter than those of
// the map the client checks against: a write the client let through is
// then refused by every replica, and nothing of it is applied (for a
// batch: in no group, as every group checks all its operations against
// max_key, max_value and max_request; a group whose heap is full refuses
// its own share only). errors.Is matches ErrRefused and, by the limit,
// ErrKeyTooLarge (max_key), ErrValueTooLarge (max_value) or
// ErrBatchTooLarge (max_request: the request's bytes; max_multi).
type LimitError struct {
	// Group is the group whose reply refused the write.
	Group uint32
	// Op is the index (in the batch) of the first operation breaking the
	// limit; -1 when the limit is on the whole request.
	Op int
	// Limit names the limit: max_key, max_value (the cluster config's
	// names), max_request (max_key + max_value + 4 KiB), max_multi (32),
	// heap (the group's heap regions are all in use), or max_stages (the
	// group no longer held a request sent in parts: more than 8 of the
	// client slot's were staged at once; retrying is safe).
	Limit string
	// Max is the replica's value of the limit, Size what the write had
	// (bytes; operations for max_multi).
	Max, Size uint64
}

func (e *LimitError) Error() string {
	what := "the request"
	if e.Op >= 0 {
		what = fmt.Sprintf("op %d", e.Op)
	}
	if e.Limit == "heap" {
		return fmt.Sprintf("rdmakv: group %d refused %s: its heap is full (%d of %d bytes in use)", e.Group, what, e.Size, e.Max)
	}
	had := fmt.Sprintf("%d", e.Size)
	switch e.Limit {
	case "max_key":
		had = fmt.Sprintf("a %d-byte key", e.Size)
	case "max_value":
		had = fmt.Sprintf("a %d-byte value", e.Size)
	case "max_request":
		had = fmt.Sprintf("%d bytes", e.Size)
	case "max_multi":
		had = fmt.Sprintf("%d operations", e.Size)
	case "max_stages":
		had = fmt.Sprintf("a %d-byte request sent in parts, no longer staged", e.Size)
	}
	return fmt.Sprintf("rdmakv: group %d refused %s (%s): replica limit %s=%d", e.Group, what, had, e.Limit, e.Max)
}

func (e *LimitError) Unwrap() []error {
	switch e.Limit {
	case "max_key":
		return []error{ErrRefused, ErrKeyTooLarge}
	case "max_value":
		return []error{ErrRefused, ErrValueTooLarge}
	case "max_request", "max_multi":
		return []error{ErrRefused, ErrBatchTooLarge}
	}
	return []error{ErrRefused}
}

// refusedError is the error of a StatusRefused result of group g.
func refusedError(g uint32, r kv.Result) error {
	e := &LimitError{Group: g, Op: r.FailedOp, Limit: kv.LimitName(r.Limit), Max: r.Max, Size: r.Size}
	if r.Limit != kv.LimitKey && r.Limit != kv.LimitValue {
		e.Op = -1
	}
	return e
}
