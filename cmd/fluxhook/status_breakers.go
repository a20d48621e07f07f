package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/status"
	fluxgate "github.com/fluxora/fluxhook/stages/gate"
)

func printBreakers(w io.Writer, breakers []status.Breaker, note string) error {
	fmt.Fprintln(w, "\ncircuit breakers:")
	if len(breakers) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		// OPEN SINCE is how long the endpoint has been down (this spell, across failed
		// probes); NEXT PROBE IN is the time left before the next probe, which each failed
		// probe starts again (it was once headed OPEN FOR, and read as the former).
		fmt.Fprintln(tw, "  ENDPOINT (sha256)\tSTATE\tFAILURES\tOPEN SINCE\tFAILED PROBES\tNEXT PROBE IN\tPROBE")
		for _, b := range breakers {
			since, next := "-", "-"
			if b.OpenSince != nil {
				since = formatSeconds(b.OpenAge().Seconds()) + " ago"
			} else if b.State != string(fluxgate.Closed) {
				since = "unknown" // opened under a fluxhook that did not record it
			}
			if b.State == string(fluxgate.Open) {
				next = formatSeconds(b.OpenForSeconds)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%d\t%s\t%s\n", b.Endpoint, b.State, b.Failures, since, b.FailedProbes, next, yesNo(b.ProbeHeld))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintf(w, "  %s\n", note)
	return err
}
