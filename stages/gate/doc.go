// Package gate decides, per claimed batch, which rows may be attempted now and which are held
// back until later (open circuit, retry rate limit), and learns from settled outcomes.
//
// The Gate interface is batch-shaped on purpose: a store shared across instances (Redis)
// answers a whole batch in one round trip. AllowAll is the gate with neither breaker nor
// limit; BreakerGate is the real one, deciding with a Store: redisstore (shared by every
// instance, survives restarts) or memstore (one process, used when REDIS_URL is unset). Both
// stores pass the same contract suite, gatetest.
//
// # Semantics
//
// Everything is per endpoint, named by delivery.Endpoint.Hash (the SHA-256 hex of its URL);
// no URL reaches a store or a log line.
//
// Circuit breaker (on when Params.Threshold > 0), on every attempt:
//
//   - closed: attempts flow. A failure that is retried (a network error, a timeout, any
//     non-2xx answer but the permanent ones), or one that exhausted the retry schedule with a
//     network error, a timeout, 408, 425, 429, 500, 502, 503 or 504, adds one to a count of
//     consecutive failures; a 2xx resets it; a permanent answer (410, the permanent statuses)
//     and a row that was not attempted leave it alone. At Threshold the circuit opens.
//   - open: every row is deferred to the reset time (Params.Reset after opening), with no
//     HTTP request and no attempt used. The row whose failure tripped the breaker was already
//     attempted: settle schedules its retry like any other failure, and that retry is deferred
//     like the others while the circuit is open; it is never dropped.
//   - half-open (the reset time has passed): the first row checked, by any instance, becomes
//     the probe. Its owner token, unique per check, is stored with a TTL of
//     Params.ProbeTimeout and carried in delivery.Delivery.GateToken. Other rows are deferred
//     until the probe expires (its whole remaining TTL), once: a shorter wait would bring every
//     waiting row back, to be deferred again, every such wait for as long as a hung probe
//     holds (a claim and a settle each time, for nothing). A probe that succeeds sooner must
//     not leave them waiting, so the gate that records the success calls Hooks.OnClosed with
//     the endpoint's hash, for the caller to bring forward the rows it deferred behind that
//     breaker. Only that instance is told: another one sharing the store holding back the
//     endpoint's rows would keep doing so until the probe expires, so Check gives each row
//     deferred behind a probe delivery.Delivery.RecheckIn, Reset when it is sooner than the
//     expiry, for the caller to hold the endpoint no longer and ask the gate again then (its
//     next Check reads the store's current state). Only the owner's result moves the breaker
//     and only the
//     owner releases the probe: success closes the circuit; a retryable failure opens it for
//     another Reset; a permanent answer or no attempt (saturated endpoint, shutdown) gives the
//     probe back unchanged, so the next row checked probes. Rows already deferred behind a
//     probe that ended either way would wait for its expiry, so Record tells the caller, on
//     the probe's row (delivery.Delivery.ProbeEnded, NextProbe), when the next probe may go
//     (after Reset, or now), for it to bring a row forward to probe then and to try the
//     endpoint again no later. A prober that crashes never reports; its probe expires after
//     ProbeTimeout and another row probes. A probe that the rate limiter refuses is never
//     taken (released at once, in the same atomic step), so it cannot wedge the breaker.
//
// Stragglers: a result that arrives while the circuit is open or half-open from an attempt
// that does not hold the probe (it was admitted before the circuit opened, was admitted while
// the store was unreachable, or held a probe that has since expired) changes nothing: a
// failure does not extend the open period and a success does not close the circuit. The
// breaker opened on Threshold consecutive failures; letting late results reopen or close it
// would make its state depend on the timing of requests that were in flight across instances,
// and a burst of stragglers could keep pushing the reset time out. Exactly one attempt, the
// probe, decides when a circuit closes.
//
// Rate limiter (on when Params.RetryRPS > 0): a sliding window of Params.Window (1 s) per
// endpoint counts every attempt it admits (first attempts, retries, probes) and, apart, the
// retries among them. First attempts are counted but never refused: new events are not
// throttled. A retry (attempt > 1) is admitted while the window holds fewer than RetryRPS
// attempts, or while fewer than the reserve, max(1, ceil(RetryRPS × Params.RetryShare))
// (RetryShare 0.5 by default), retries were admitted in it. Without a reserve, first attempts
// at RetryRPS or more would keep the window full and no retry would ever be sent, however long
// the backlog; with it, retries progress at the reserve per window under any first-attempt
// load, and at RetryRPS per window with none. Retries still never exceed RetryRPS per window
// (the reserve is at most RetryRPS), which is what the limit protects a struggling endpoint
// from. A refused retry is deferred, never dropped, and not counted (it was not attempted).
//
// Deferred retries are spaced per endpoint, across batches and instances: the store keeps the
// latest slot it handed a deferred retry (by its clock, forgotten a window and a second after
// it), and each refused retry gets the next, slot = max(last slot + spacing, when the window
// frees a place for a retry), with Delay = slot − now. The window frees a place when the attempt whose departure
// takes it below RetryRPS leaves, or the retry whose departure takes the retries below the
// reserve, whichever is first. Spaced per check instead, the retries of every batch (and every
// instance) refused at the same moment would take the same moments: they would come back
// together and collide again, and a backlog of B retries would cost about B²/RetryRPS
// deferrals, a claim and a settle each. One sequence of slots per endpoint makes it about one
// deferral per retry.
//
// The spacing is Window / max(reserve, retries admitted in the current window), at most
// Window / RetryRPS: the rate at which the limiter admits retries now. A retry is refused only
// when the window is full, so the retries in it are what RetryRPS left after first attempts
// (RetryRPS − first attempts, never less than the reserve). Slots at that rate bring the
// retries back about as fast as the limiter admits them, so a retry that returns at its slot is
// normally admitted: a wider spacing would leave the limit unused, a narrower one would bring
// retries back faster than they can be admitted.
//
// A retry that comes back from a rate-limit deferral (the row's deferral reason, which the
// claim reads: delivery.Delivery.DeferredBy, EndpointCheck.Returning) and is refused again is
// promised a place ahead of the queue, not a slot at its end: the next departure from the
// window that frees a place for a retry, no earlier than the window frees one and after the
// last place promised; when every such departure is promised, one spacing after the last
// promise (the store keeps it as it keeps the last slot). And a promised place is held: until
// a spacing after the last promise, a retry that does not come back from a deferral queues at
// the end even when the window has room. Places free a window after the attempt that took
// them, not after its slot: a retry that came back a little late (the claim's timer, the
// claim, the round trip) frees its place a little late, and the one after it, back on time,
// finds the window still full. Sent to the end of the queue, each such miss left a place
// unused until the next slot: retries ran at 70–75% of the limit, alone or beside first
// attempts (issue 32). Promised all the same place, the returning retries came back together
// and all but one were refused again, each time (7 deferrals per retry at a limit of 10 beside
// first attempts); with places not held, retries newly due from the retry schedule took them
// and sent the promised ones to the back (82% beside first attempts). As it is, about two
// deferrals per retry, and the rate loses about a claim's lag per place (gatetest's
// RateLimitLateReturnsKeepTheRate). Scripts of a fluxhook that predates this (a rolling
// upgrade) ignore the flag and the promise's key, and queue such a retry at the end of the
// same queue.
//
// Deferral: a held row gets Outcome{Kind: delivery.Defer, Delay, Reason}; settle re-enqueues it
// due after Delay with the same delivery id and attempt number, and it is claimed again then.
//
// Time: stores compare times by their own clock (Redis's TIME inside its scripts), never the
// calling instance's, and return relative delays.
//
// # Failure modes
//
// Store unreachable or slow (Redis down, network partition): each store call is bounded by
// Params.StoreTimeout; on an error the gate allows every row of the batch (fail open: no event
// is held back, none is lost), calls Hooks.OnFailOpen once per row, and logs one warning per
// outage. For Params.StoreRetry after an error it fails open without calling the store, so an
// outage costs at most one timeout per StoreRetry; then the next batch tries again, and once
// the store answers the gate uses it again (one log line), with no restart. Outcomes are
// recorded best effort: those settled during an outage are lost, which can only delay an
// opening (failures not counted) or leave a probe to expire after ProbeTimeout.
//
// Redis restarted without persistence: every circuit is closed, every window empty and no slot
// handed out again; scripts are reloaded automatically (NOSCRIPT → EVAL, once).
//
// Corrupt store state (a Redis key of the wrong type, a value or field no script wrote, a key
// without its expiry) is never an error: it reads as no state (closed, no failures, no probe,
// an empty window, no slot handed out) and is deleted by the next decision or record on that
// endpoint that reads it, so the breaker again opens after Threshold failures counted from
// there.
//
// In-process store: state is per process and lost on restart; with several instances, each
// has its own breaker and limit (set REDIS_URL to share them).
//
// Logs: one line per breaker transition (an opening is a warning, logged by the instance that
// made it), never one per row; one per store outage and one per recovery.
package gate
