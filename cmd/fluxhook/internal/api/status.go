package api

import (
	"net/http"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/status"
)

// getStatus serves the report `fluxhook status --json` prints, for operators (an admin key or
// an operator's portal session): the queue, retries, dead letters, dispatchers, endpoints and
// breakers, as of one snapshot.
func (s *Server) getStatus(q *request) error {
	rep, err := status.Read(q.ctx, s.cfg.Pool, status.Options{RedisURL: s.cfg.RedisURL, WebhookURL: s.cfg.DefaultURL})
	if err != nil {
		return err
	}
	writeJSON(q.w, http.StatusOK, rep)
	return nil
}
