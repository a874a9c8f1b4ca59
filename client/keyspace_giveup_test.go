package client_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmakv/rdmakv/client"
)

// giveUpWhilePosting: an ordered put ("victim") is taken into a message
// that another caller posts; while that caller encodes it, the put's
// caller gives up (ErrOutcomeUnknown) and, on the same goroutine, puts
// another key ("intrud", same length) to a group that does not own the
// keyspace (ErrKeyMoved: nothing written). The message then goes out. The
// group must apply the victim's value under "victim", never under the
// other key: the combiner keeps an ordered op's internal key in a buffer
// pooled with the op, which must not be reused while a message still
// reads it. It returns what the owning group holds for both keys.
func giveUpWhilePosting(t *testing.T, plant bool) (victim, intruder string) {
	lc := startLocal(t, orderedMap("ksgiveup", 2))
	c := open(t, lc, 0, client.WithTimeout(time.Minute))
	if plant {
		client.PlantReuseUnposted(c)
	}
	users := c.Keyspace("users")
	moved := c.Keyspace("users")
	client.SetKeyspaceGroup(moved, 1)
	ctx := context.Background()
	if _, err := users.Put(ctx, []byte("warm"), []byte("w")); err != nil {
		t.Fatal(err)
	}
	var posts atomic.Int32
	hold1, hold2, taken := make(chan struct{}), make(chan struct{}), make(chan struct{})
	client.SetOnPost(c, func() {
		switch posts.Add(1) {
		case 1: // the first sender's own message
			<-hold1
		case 2: // the victim's message, posted by the first sender
			close(taken)
			<-hold2
		}
	})
	first := make(chan error, 1)
	go func() {
		_, err := users.Put(ctx, []byte("first"), []byte("f"))
		first <- err
	}()
	for posts.Load() < 1 {
		time.Sleep(50 * time.Microsecond)
	}
	vctx, cancel := context.WithCancel(ctx)
	victimDone := make(chan error, 2)
	go func() {
		_, err := users.Put(vctx, []byte("victim"), []byte("v1"))
		victimDone <- err
		_, err = moved.Put(ctx, []byte("intrud"), []byte("i"))
		victimDone <- err
	}()
	for {
		if _, q := client.CombinerLoad(c); q == 1 {
			break
		}
		time.Sleep(50 * time.Microsecond)
	}
	close(hold1)
	<-taken // the victim's message is being posted by the first sender
	cancel()
	if err := <-victimDone; !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("the victim's put, given up while posted: %v", err)
	}
	if err := <-victimDone; !errors.Is(err, client.ErrKeyMoved) {
		t.Fatalf("the put to the other group: %v", err)
	}
	close(hold2)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	client.SetOnPost(c, nil)
	get := func(k string) string {
		v, err := users.Get(ctx, []byte(k))
		if errors.Is(err, client.ErrNotFound) {
			return ""
		}
		if err != nil {
			t.Fatal(err)
		}
		return string(v)
	}
	// The victim's message was sent: it is applied, once, soon.
	for deadline := time.Now().Add(30 * time.Second); ; {
		victim, intruder = get("victim"), get("intrud")
		if victim != "" || intruder != "" || time.Now().After(deadline) {
			return victim, intruder
		}
		time.Sleep(time.Millisecond)
	}
}

// TestKeyspaceGiveUpWhilePosting: a write given up while its message is
// being encoded is applied under its own key (giveUpWhilePosting).
func TestKeyspaceGiveUpWhilePosting(t *testing.T) {
	victim, intruder := giveUpWhilePosting(t, false)
	if victim != "v1" || intruder != "" {
		t.Fatalf(`after the message: victim=%q, intrud=%q; want victim="v1" and intrud absent`, victim, intruder)
	}
}

// TestKeyspaceGiveUpWhilePostingMutant: with the planted reuseUnposted the
// victim's value lands under the other key (the pooled op's buffer is
// reused on the same goroutine, so the pool hands it back; under -race
// the pool drops a share of what it is given, hence a few attempts).
func TestKeyspaceGiveUpWhilePostingMutant(t *testing.T) {
	for attempt := range 8 {
		var victim, intruder string
		t.Run(fmt.Sprint(attempt), func(t *testing.T) { victim, intruder = giveUpWhilePosting(t, true) })
		if intruder != "" {
			t.Logf("caught on attempt %d: victim=%q, intrud=%q", attempt, victim, intruder)
			return
		}
	}
	t.Fatal("reuseUnposted not caught in 8 attempts")
}
