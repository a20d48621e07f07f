package verify_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/fluxora/fluxhook/stages/sign/verify"
)

// testStore is the DedupStore contract: any implementation (a Redis one, say) should pass it.
func testStore(t *testing.T, newStore func() verify.DedupStore) {
	ctx := context.Background()
	t.Run("claim, then acknowledge", func(t *testing.T) {
		t.Parallel()
		s := newStore()
		if err := s.Claim(ctx, "a"); err != nil {
			t.Fatalf("first Claim = %v", err)
		}
		if err := s.Claim(ctx, "a"); !errors.Is(err, verify.ErrDuplicate) {
			t.Errorf("Claim while held = %v, want ErrDuplicate (or ErrInProgress)", err)
		}
		if err := s.Settle(ctx, "a", true); err != nil {
			t.Fatal(err)
		}
		if err := s.Claim(ctx, "a"); !errors.Is(err, verify.ErrDuplicate) {
			t.Errorf("Claim after acknowledgement = %v, want ErrDuplicate", err)
		}
		if err := s.Claim(ctx, "b"); err != nil {
			t.Errorf("Claim of another id = %v", err)
		}
	})
	t.Run("release", func(t *testing.T) {
		t.Parallel()
		s := newStore()
		for i := range 3 {
			if err := s.Claim(ctx, "a"); err != nil {
				t.Fatalf("Claim %d after releases = %v", i+1, err)
			}
			if err := s.Settle(ctx, "a", false); err != nil {
				t.Fatal(err)
			}
		}
	})
	t.Run("concurrent claims: exactly one wins", func(t *testing.T) {
		t.Parallel()
		s := newStore()
		const n = 64
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { errs[i] = s.Claim(ctx, "same") })
		}
		wg.Wait()
		won := 0
		for _, err := range errs {
			switch {
			case err == nil:
				won++
			case !errors.Is(err, verify.ErrDuplicate):
				t.Errorf("Claim = %v", err)
			}
		}
		if won != 1 {
			t.Errorf("%d of %d concurrent claims won, want 1", won, n)
		}
	})
}

func TestMemoryStore(t *testing.T) {
	t.Parallel()
	testStore(t, func() verify.DedupStore { return verify.NewMemoryStore(10) })
	t.Run("zero value", func(t *testing.T) {
		t.Parallel()
		testStore(t, func() verify.DedupStore { return new(verify.MemoryStore) })
	})
}

func TestMemoryStoreHeldIsInProgress(t *testing.T) {
	t.Parallel()
	s := verify.NewMemoryStore(10)
	_ = s.Claim(context.Background(), "a")
	if err := s.Claim(context.Background(), "a"); !errors.Is(err, verify.ErrInProgress) {
		t.Errorf("Claim while held = %v, want ErrInProgress", err)
	}
}

// TestMemoryStoreEvictsOldest: the store holds size ids and forgets the earliest
// acknowledged first.
func TestMemoryStoreEvictsOldest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := verify.NewMemoryStore(2)
	ack := func(id string) error {
		if err := s.Claim(ctx, id); err != nil {
			return err
		}
		return s.Settle(ctx, id, true)
	}
	for _, id := range []string{"a", "b", "c"} {
		if err := ack(id); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
	}
	if s.Len() != 2 {
		t.Errorf("Len = %d, want the bound 2", s.Len())
	}
	if err := s.Claim(ctx, "c"); !errors.Is(err, verify.ErrDuplicate) {
		t.Errorf("newest id c: %v, want ErrDuplicate", err)
	}
	if err := s.Claim(ctx, "b"); !errors.Is(err, verify.ErrDuplicate) {
		t.Errorf("id b: %v, want ErrDuplicate", err)
	}
	if err := ack("a"); err != nil { // a was the oldest: forgotten, now the newest
		t.Errorf("oldest id a: %v, want it forgotten", err)
	}
	if err := ack("b"); err != nil { // a's return pushed out b
		t.Errorf("id b after a came back: %v, want it forgotten", err)
	}
	if err := s.Claim(ctx, "a"); !errors.Is(err, verify.ErrDuplicate) {
		t.Errorf("id a after coming back: %v, want ErrDuplicate", err)
	}
	if s.Len() != 2 {
		t.Errorf("Len = %d, want 2", s.Len())
	}
}

func TestMemoryStoreLongIDs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := verify.NewMemoryStore(10)
	long := strings.Repeat("x", 1<<16)
	if err := s.Claim(ctx, long); err != nil {
		t.Fatal(err)
	}
	_ = s.Settle(ctx, long, true)
	if err := s.Claim(ctx, long+"y"); err != nil {
		t.Errorf("ids sharing a long prefix collide: %v", err)
	}
	if err := s.Claim(ctx, long); !errors.Is(err, verify.ErrDuplicate) {
		t.Errorf("long id again: %v, want ErrDuplicate", err)
	}
}
