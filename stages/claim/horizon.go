package claim

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Horizon keeps the hold-back of ordered delivery: the largest outbox id at or below which
// every row that will ever commit is visible to the next claim. Ordered rows above it wait,
// so that a producer transaction that drew a smaller id of the same stream and commits late
// cannot have its event overtaken (schema 6).
//
// Each claim that orders reads webhook_outbox_horizon() after its snapshot: the identity
// sequence's last value L, then the sessions holding webhook_outbox's RowExclusiveLock (an
// inserting transaction takes it before drawing its id, and keeps it until it ends). An id up
// to L that was not visible belongs to one of those holders. When a later reading no longer
// lists any of them, and lists no prepared transaction it did not (see newlyPrepared), all
// have ended, and every claim from the next one on (its snapshot is
// taken after that reading) sees every committed id up to L. A reading with no holders at all
// settles its own L for the next claim. A claim that arms also takes a reading just before its
// statement (Claimer.Claim), which it may use at once when it finds no holders: an event alone
// usually goes with the first claim, and otherwise with the one after, as it did before.
//
// The zero value is ready to use; one claiming loop owns it (not safe for concurrent use).
type Horizon struct {
	safe    int64
	pending []reading // oldest first, each with a larger last than safe
}

type reading struct {
	last    int64
	holders []string
}

// maxPending bounds the readings kept while holders stay: the newest replaces the newest,
// since the oldest readings are the ones that resolve first.
const maxPending = 64

// Safe is the horizon for the next claim.
func (h *Horizon) Safe() int64 { return h.safe }

// Waiting reports whether readings wait for their holders to end: ordered rows above Safe
// may be held back, and the claiming loop looks again soon.
func (h *Horizon) Waiting() bool { return len(h.pending) > 0 }

// Observe records a claim's reading ('<last id>:<holder>,<holder>…') and reports whether the
// horizon moved (ordered rows it held back may be claimable now).
func (h *Horizon) Observe(text string) (bool, error) {
	lastText, holdersText, ok := strings.Cut(text, ":")
	last, err := strconv.ParseInt(lastText, 10, 64)
	if !ok || err != nil {
		return false, fmt.Errorf("malformed hold-back reading %q", text)
	}
	var holders []string
	if holdersText != "" {
		holders = strings.Split(holdersText, ",")
	}
	before := h.safe
	// Earlier readings whose holders have all ended.
	kept := h.pending[:0]
	for _, r := range h.pending {
		if ended(r.holders, holders) && !newlyPrepared(r.holders, holders) {
			h.safe = max(h.safe, r.last)
		} else {
			kept = append(kept, r)
		}
	}
	h.pending = kept
	switch {
	case last <= h.safe:
	case len(holders) == 0:
		h.safe = last
	case len(h.pending) >= maxPending:
		h.pending[len(h.pending)-1] = reading{last, holders}
	default:
		h.pending = append(h.pending, reading{last, holders})
	}
	h.pending = slices.DeleteFunc(h.pending, func(r reading) bool { return r.last <= h.safe })
	return h.safe != before, nil
}

// newlyPrepared reports whether now lists a prepared transaction (schema 10 marks them 'p')
// that then did not: PREPARE TRANSACTION hands a transaction's locks to another virtual
// transaction id, so one of then's holders may live on under it. A reading is not settled
// while that may be so. A prepared transaction keeps its id across a restart of the server,
// and a reading that listed it waits for it like for any holder.
func newlyPrepared(then, now []string) bool {
	for _, x := range now {
		if strings.HasPrefix(x, "p") && !slices.Contains(then, x) {
			return true
		}
	}
	return false
}

// ended reports whether none of then is among now.
func ended(then, now []string) bool {
	for _, x := range then {
		if slices.Contains(now, x) {
			return false
		}
	}
	return true
}
