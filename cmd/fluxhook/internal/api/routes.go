package api

// table is every operation of the API. A test checks that it and openapi.json name the same
// operations, and the isolation test calls each one with two tenants' keys.
func (s *Server) table() []Route {
	return []Route{
		{Method: "GET", Pattern: "/v1/endpoints", handle: s.listEndpoints},
		{Method: "POST", Pattern: "/v1/endpoints", handle: s.createEndpoint},
		{Method: "GET", Pattern: "/v1/endpoints/{id}", handle: s.getEndpoint},
		{Method: "PATCH", Pattern: "/v1/endpoints/{id}", handle: s.updateEndpoint},
		{Method: "DELETE", Pattern: "/v1/endpoints/{id}", handle: s.deleteEndpoint},
		{Method: "POST", Pattern: "/v1/endpoints/{id}/rotate-secret", handle: s.rotateSecret},
		{Method: "POST", Pattern: "/v1/endpoints/{id}/disable", handle: s.disableEndpoint},
		{Method: "POST", Pattern: "/v1/endpoints/{id}/enable", handle: s.enableEndpoint},
		{Method: "POST", Pattern: "/v1/endpoints/{id}/test", handle: s.sendTestEvent},
		{Method: "GET", Pattern: "/v1/endpoints/{id}/health", handle: s.endpointHealth},
		{Method: "GET", Pattern: "/v1/endpoints/{id}/deliveries", handle: s.listEndpointDeliveries},

		{Method: "GET", Pattern: "/v1/events", handle: s.listEvents},
		{Method: "GET", Pattern: "/v1/events/{delivery_id}", handle: s.getEvent},
		{Method: "GET", Pattern: "/v1/deliveries/{delivery_id}", handle: s.getDelivery},

		{Method: "POST", Pattern: "/v1/endpoints/{id}/recover", handle: s.startRecovery},
		{Method: "GET", Pattern: "/v1/recoveries/{id}", handle: s.getRecovery},
		{Method: "POST", Pattern: "/v1/recoveries/{id}/cancel", handle: s.cancelRecovery},
		{Method: "GET", Pattern: "/v1/dead-letters", handle: s.listDeadLetters},
		{Method: "GET", Pattern: "/v1/dead-letters/{id}", handle: s.getDeadLetter},
		{Method: "POST", Pattern: "/v1/dead-letters/{id}/replay", handle: s.replayDeadLetter},

		{Method: "GET", Pattern: "/v1/audit", handle: s.listAudit},
		{Method: "GET", Pattern: "/v1/me", handle: s.me},

		{Method: "GET", Pattern: "/v1/api-keys", Admin: true, handle: s.listKeys},
		{Method: "POST", Pattern: "/v1/api-keys", Admin: true, handle: s.createKey},
		{Method: "DELETE", Pattern: "/v1/api-keys/{id}", Admin: true, handle: s.revokeKey},
		{Method: "POST", Pattern: "/v1/tenants/{tenant}/portal-sessions", Admin: true, handle: s.createTenantPortalSession},
		{Method: "POST", Pattern: "/v1/portal-sessions", Admin: true, handle: s.createAdminPortalSession},
		{Method: "GET", Pattern: "/v1/portal-sessions", Admin: true, handle: s.listPortalSessions},
		{Method: "DELETE", Pattern: "/v1/portal-sessions/{id}", Admin: true, handle: s.revokePortalSession},
		{Method: "GET", Pattern: "/v1/tenants", AdminOrPortal: true, handle: s.listTenants},
		{Method: "GET", Pattern: "/v1/status", AdminOrPortal: true, handle: s.getStatus},
	}
}
