package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/status"
)

func init() {
	commands["status"] = command{summary: "Backlog, leases, retries, dead letters and dispatchers (--json for monitoring)", run: runStatus}
}

// runStatus answers "is delivery keeping up, and is anything stuck?" from the database alone,
// so it works while no dispatcher is running, which is when it is most needed.
func runStatus(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("status", env, "fluxhook status [--json]")
	dbURL := databaseURLFlag(fs, env)
	asJSON := fs.Bool("json", false, "print one JSON object with stable snake_case fields")
	redisURL := fs.String("redis-url", "", "Redis holding the shared breaker state, as serve has it")
	document(fs, "redis-url", flagDoc{Placeholder: "URL", Env: "REDIS_URL"})
	webhookURL := fs.String("webhook-url", "", "the consumer URL serve has, to include its breaker")
	document(fs, "webhook-url", flagDoc{Placeholder: "URL", Env: "WEBHOOK_URL"})
	if err := noArguments(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	pool, err := connectCurrent(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()

	rep, err := status.Read(ctx, pool, status.Options{RedisURL: orEnv(*redisURL, env, "REDIS_URL"),
		WebhookURL: orEnv(*webhookURL, env, "WEBHOOK_URL")})
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(env.stdout, rep)
	}
	return printStatus(env.stdout, rep)
}

func printStatus(w io.Writer, rep status.Report) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "schema version\t%d\n", rep.SchemaVersion)
	fmt.Fprintf(tw, "database time\t%s\n", formatTime(rep.DatabaseTime))
	fmt.Fprintf(tw, "backlog\t%d\tdue, waiting to be claimed\n", rep.Backlog)
	fmt.Fprintf(tw, "oldest due age\t%s\n", formatSeconds(rep.OldestDueAgeSeconds))
	fmt.Fprintf(tw, "in-flight leases\t%d\n", rep.InFlight)
	fmt.Fprintf(tw, "retries pending\t%d\n", rep.RetriesPending)
	fmt.Fprintf(tw, "scheduled\t%d\tnot yet due (retries, deferred and delayed rows)\n", rep.Scheduled)
	for _, d := range rep.Deferred {
		if d.NextDueSeconds < 0 {
			fmt.Fprintf(tw, "  deferred\t%d\t%s\n", d.Count, printable(d.Reason))
			continue
		}
		fmt.Fprintf(tw, "  deferred\t%d\t%s; next due in %s\n", d.Count, printable(d.Reason), formatSeconds(d.NextDueSeconds))
	}
	fmt.Fprintf(tw, "oldest undelivered\t%s\tsince the first enqueue of the oldest event not yet delivered\n", formatSeconds(rep.OldestUndeliveredAgeSeconds))
	fmt.Fprintf(tw, "processed last hour\t%s\n", cappedCount("more than", rep.ProcessedLastHour, rep.ProcessedLastHourCapped))
	fmt.Fprintf(tw, "dead letters\t%d\t%d not replayed\n", rep.DeadLetters, rep.DeadLettersNotReplayed)
	if rep.StreamRowsBeyondSequence > 0 {
		fmt.Fprintf(tw, "rows beyond id sequence\t%d\tstream rows with ids supplied by a producer: ordered delivery holds each until the sequence reaches it; let the sequence draw ordered events' ids\n",
			rep.StreamRowsBeyondSequence)
	}
	if rep.OutboxIDSequenceCache > 1 {
		fmt.Fprintf(tw, "id sequence cache\t%d\tordered delivery needs 1: ALTER SEQUENCE webhook_outbox_id_seq CACHE 1\n", rep.OutboxIDSequenceCache)
	}
	if rep.NotifySecondsLeft > 0 {
		fmt.Fprintf(tw, "producers notify\tyes\tfor %s more: a dispatcher is waiting for work\n", formatSeconds(rep.NotifySecondsLeft))
	} else {
		fmt.Fprintf(tw, "producers notify\tno\tevery dispatcher is busy, or none is running\n")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rep.DeadLettersByReason) > 0 {
		fmt.Fprintln(w, "\ndead letters by reason (top 10):")
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  COUNT\tNOT REPLAYED\tREASON")
		for _, r := range rep.DeadLettersByReason {
			fmt.Fprintf(tw, "  %d\t%d\t%s\n", r.Count, r.NotReplayed, printable(r.Reason))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(rep.Endpoints) > 0 || rep.UnroutedLastHour > 0 {
		fmt.Fprintf(w, "\nendpoints (%d; events matching none in the last hour: %s):\n", len(rep.Endpoints),
			cappedCount("at least", rep.UnroutedLastHour, rep.UnroutedLastHourCapped))
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  ID\tURL\tTENANT\tENABLED\tPENDING\tLAST SUCCESS\tFAILING SINCE\tDISABLED REASON")
		when := func(t *time.Time) string {
			if t == nil {
				return "-"
			}
			return formatTime(t.UTC())
		}
		for _, e := range rep.Endpoints {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", e.ID, printable(e.URL), printable(e.Tenant), yesNo(e.Enabled),
				e.Pending, when(e.LastSuccessAt), when(e.FailingSince), printable(e.DisabledReason))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintln(w, "\ndispatchers:")
	if len(rep.Dispatchers) == 0 {
		fmt.Fprintln(w, "  none registered")
	} else {
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  INSTANCE\tARMED\tSTALE\tSTARTED\tLAST SEEN")
		stale := false
		for _, d := range rep.Dispatchers {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s ago\n", printable(d.InstanceID), yesNo(d.Armed), yesNo(d.Stale),
				formatTime(d.StartedAt), formatSeconds(d.SeenAgeSeconds))
			stale = stale || d.Stale
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if stale {
			fmt.Fprintf(w, "  stale: no heartbeat for over %s (live instances beat at least every 30s): probably stopped without\n"+
				"  unregistering; a running instance deletes the row 5 minutes after its last heartbeat\n", status.DispatcherStaleAfter)
		}
	}
	return printBreakers(w, rep.Breakers, rep.BreakersNote)
}

// orEnv is a flag's value, or the environment variable's when the flag is unset.
func orEnv(flagValue string, env *environment, name string) string {
	if flagValue != "" {
		return flagValue
	}
	return env.getenv(name)
}

func formatTime(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") }

// formatSeconds rounds an age for people: tenths of a second below a minute, seconds above.
func formatSeconds(s float64) string {
	d := time.Duration(s * float64(time.Second))
	if d < time.Minute {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// cappedCount prints a count that stopped at its cap as "more than N" or "at least N" (bound
// says which the count is).
func cappedCount(bound string, n int64, capped bool) string {
	if capped {
		return fmt.Sprintf("%s %d (status counts no further)", bound, n)
	}
	return strconv.FormatInt(n, 10)
}
