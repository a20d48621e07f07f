package verify

import (
	"context"
	"crypto/sha256"
	"sync"
)

// DedupStore is where a Verifier remembers delivery ids (check 7) and signatures (check 8,
// as keys starting "x-fluxora-signature:"). Implement it over a shared database or Redis when
// several consumer instances receive the same endpoint's deliveries; the default,
// MemoryStore, only knows what one process has seen. A store that forgets keys must keep
// each for at least twice the Verifier's tolerance, or a replay can pass check 8 once its
// signature is forgotten.
//
// Checking and recording are one operation, Claim, because two requests with the same id can
// arrive together (a retry overtaking a slow first attempt, two dispatcher instances): with a
// separate look-up and record both would pass. A claim is held while the handler runs and is
// then settled: remembered if the sender got a 2xx, released if not.
type DedupStore interface {
	// Claim atomically holds id for one request. It returns nil when id was neither
	// remembered nor held; ErrDuplicate when it was remembered; ErrInProgress (or
	// ErrDuplicate) when another request holds it; any other error when the store cannot
	// tell. A store that outlives the process should let a held claim expire, so that a
	// consumer crashing mid-request does not block the id for ever.
	Claim(ctx context.Context, id string) error
	// Settle ends the claim on id: when acknowledged, id is remembered and refused from
	// then on; otherwise it is released and the next request with it is handled.
	Settle(ctx context.Context, id string, acknowledged bool) error
}

// MemoryStore is the in-process DedupStore, bounded so that a long-running consumer does not
// grow without limit: it remembers the most recently acknowledged keys (ids and signatures,
// two per delivery), forgetting the oldest first. Keys are kept as SHA-256 digests, so the
// memory per key is fixed whatever its length. Claims in progress are few (two per request
// being handled) and are not counted. The zero value is ready to use and remembers
// DefaultStoreSize keys.
type MemoryStore struct {
	mu      sync.Mutex
	size    int
	done    map[digest]struct{} // acknowledged ids
	ring    []digest            // the same ids in acknowledgement order, for eviction
	next    int                 // ring index of the oldest id once the ring is full
	pending map[digest]struct{} // claimed, not yet settled
}

type digest [sha256.Size]byte

// NewMemoryStore returns a store remembering up to size acknowledged keys (a delivery takes
// two under Middleware); size <= 0 means DefaultStoreSize.
func NewMemoryStore(size int) *MemoryStore {
	if size <= 0 {
		size = DefaultStoreSize
	}
	return &MemoryStore{size: size}
}

// init makes the zero value usable; called with mu held.
func (s *MemoryStore) init() {
	if s.done == nil {
		if s.size <= 0 {
			s.size = DefaultStoreSize
		}
		s.done = make(map[digest]struct{})
		s.pending = make(map[digest]struct{})
	}
}

// Claim implements DedupStore; it never fails for another reason than a duplicate.
func (s *MemoryStore) Claim(_ context.Context, id string) error {
	k := sha256.Sum256([]byte(id))
	s.mu.Lock()
	defer s.mu.Unlock()
	s.init()
	if _, ok := s.done[k]; ok {
		return ErrDuplicate
	}
	if _, ok := s.pending[k]; ok {
		return ErrInProgress
	}
	s.pending[k] = struct{}{}
	return nil
}

// Settle implements DedupStore; it never fails.
func (s *MemoryStore) Settle(_ context.Context, id string, acknowledged bool) error {
	k := sha256.Sum256([]byte(id))
	s.mu.Lock()
	defer s.mu.Unlock()
	s.init()
	delete(s.pending, k)
	if !acknowledged {
		return nil
	}
	if _, ok := s.done[k]; ok {
		return nil
	}
	if len(s.ring) < s.size {
		s.ring = append(s.ring, k)
	} else {
		delete(s.done, s.ring[s.next])
		s.ring[s.next] = k
		s.next = (s.next + 1) % s.size
	}
	s.done[k] = struct{}{}
	return nil
}

// Len is how many acknowledged keys the store remembers, at most its size.
func (s *MemoryStore) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.done)
}
