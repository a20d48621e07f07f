package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/cli"
	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/dispatcher"
	"github.com/fluxora/fluxhook/stages/send"
	"github.com/fluxora/fluxhook/stages/sign"
)

// setting is one configuration variable. Every setting is an environment variable and a flag
// of the same name in lower case with dashes (WEBHOOK_URL ↔ --webhook-url); a flag wins over
// the environment. Defaults are written here, in one place, as the operator would type them.
type setting struct {
	env  string
	def  string
	help string
	// shownDef is what -h says of a default worked out from other settings (def is empty).
	shownDef string
	secret   bool
}

// settings lists every variable `serve` reads, with the original's names and defaults where
// it had them.
var settings = []setting{
	{env: "DATABASE_URL", help: "PostgreSQL connection URL (required)", secret: true},
	{env: "DATABASE_LISTEN_URL", help: "connection URL for the LISTEN session alone, to the same database (e.g. direct, when DATABASE_URL goes through a pooler)", shownDef: "DATABASE_URL", secret: true},
	{env: "REDIS_URL", help: "Redis for the circuit breaker and rate limit shared by every instance (redis://, rediss://, unix://; Sentinel with ?master_name=; Cluster with ?cluster=true&addr=...)", shownDef: "none: each instance keeps its own, in-process", secret: true},
	{env: "WEBHOOK_URL", help: "consumer URL for rows without endpoint_url; https unless loopback (optional when endpoints are managed with fluxhook endpoints)"},
	{env: "WEBHOOK_SECRET", help: "HMAC signing secret for WEBHOOK_URL and endpoint_url rows (required with WEBHOOK_URL)", secret: true},
	{env: "WEBHOOK_SECRET_PREVIOUS", help: "previous secret during a rotation", secret: true},
	{env: "WEBHOOK_SIGNATURE_SCHEME", def: "fluxora", help: "how requests are signed (docs/wire-format.md)"},
	{env: "WEBHOOK_POLL_INTERVAL_MS", def: "10000", help: "backstop poll interval"},
	{env: "WEBHOOK_BATCH_SIZE", def: "100", help: "most rows per claim (the original's default was 10)"},
	{env: "WEBHOOK_MAX_IN_FLIGHT", def: "1000", help: "rows claimed and not yet settled; also the number of send workers"},
	{env: "WEBHOOK_ENDPOINT_CONCURRENCY", def: "64", help: "concurrent requests per endpoint"},
	{env: "WEBHOOK_TIMEOUT_MS", def: "30000", help: "HTTP request timeout"},
	{env: "WEBHOOK_LEASE_MS", help: "claim lease", shownDef: "2 × WEBHOOK_TIMEOUT_MS + 30000"},
	{env: "WEBHOOK_DRAIN_TIMEOUT_MS", help: "how long SIGTERM waits for in-flight requests", shownDef: "WEBHOOK_TIMEOUT_MS + 5000"},
	{env: "WEBHOOK_RETRY_SCHEDULE", def: "5s,1m,5m,30m,2h,6h,12h,24h", help: "waits before each retry; its length sets the attempts"},
	{env: "WEBHOOK_MAX_PAYLOAD_BYTES", def: "1048576", help: "larger payloads are dead-lettered"},
	{env: "WEBHOOK_RESPONSE_EXCERPT_BYTES", def: "1024", help: "how much of each consumer answer is stored with the attempt (delivery log, dead letters); 0 = none, at most 65536"},
	{env: "WEBHOOK_PERMANENT_STATUSES", def: "413", help: "consumer answers dead-lettered at once besides 410 (comma-separated, or none); every other non-2xx answer is retried on the schedule"},
	{env: "WEBHOOK_409_DELIVERED", help: "a consumer's 409 Conflict means it already has the event (settled delivered, not dead-lettered)", shownDef: "true under the fluxora scheme, false under standard"},
	{env: "WEBHOOK_ORDERING", def: "none", help: "stream delivers each stream_id's rows for WEBHOOK_URL and endpoint_url one at a time, in id order (docs/ordering.md); none keeps no order"},
	{env: "WEBHOOK_ORDERING_FAILURE", def: "skip", help: "when an ordered stream's head is dead-lettered, its later events go on (skip) or wait until it is replayed or purged (stop)"},
	{env: "WEBHOOK_RETRY_RPS", def: "10", help: "attempts per second per consumer URL before retries are deferred"},
	{env: "WEBHOOK_RETRY_SHARE", def: "0.5", help: "share of WEBHOOK_RETRY_RPS kept for retries while first attempts fill the window"},
	{env: "WEBHOOK_CIRCUIT_BREAKER_THRESHOLD", def: "0", help: "consecutive retryable failures that open an endpoint's circuit; 0 = off"},
	{env: "WEBHOOK_CIRCUIT_BREAKER_RESET_MS", def: "300000", help: "how long an open circuit stays open before one probe"},
	{env: "WEBHOOK_RETENTION", def: "168h", help: "how long the delivery log (webhook_delivery_log) is kept, dropped by partition; dead letters are kept until purged"},
	{env: "WEBHOOK_ENCRYPTION_KEY", help: "base64 of 32 random bytes: managed endpoints' secrets and header values are sealed at rest with it (AES-256-GCM); without it they are stored in clear", secret: true},
	{env: "WEBHOOK_ENCRYPTION_KEY_PREVIOUS", help: "the key being rotated out: still opens secrets and header values sealed with it", secret: true},
	{env: "WEBHOOK_ENDPOINT_DISABLE_AFTER", def: "120h", help: "disable a managed endpoint failing without a success for this long"},
	{env: "WEBHOOK_ALLOWED_NETWORKS", help: "private networks (CIDRs) WEBHOOK_URL and managed endpoints may resolve to; by default private, link-local and metadata addresses are refused"},
	{env: "WEBHOOK_ROW_URL_NETWORKS", help: "networks (CIDRs, or loopback) a row's endpoint_url may reach; by default public addresses only: rows' URLs are written by producers, so neither loopback nor WEBHOOK_ALLOWED_NETWORKS applies to them"},
	{env: "LOG_LEVEL", def: "info", help: "the least severe log lines written"},
	{env: "LOG_FORMAT", def: "json", help: "log lines as JSON, or for people (console: coloured on a terminal unless NO_COLOR is set)"},
	{env: "API_ADDR", help: "address for the management API (/v1, docs/api.md), e.g. 127.0.0.1:8080: serve serves none when it is empty; fluxhook api requires it"},
	{env: "API_PUBLIC_URL", help: "the base URL users reach the API at (behind a proxy), for portal links", shownDef: "the request's host"},
	{env: "PORTAL_FRAME_ANCESTORS", help: "origins allowed to embed the portal in a frame, space-separated (e.g. https://app.example.com)", shownDef: "none"},
	{env: "API_DATABASE_URL", help: "the API's own connection, as a role with the API's grants (docs/install.md)", shownDef: "DATABASE_URL", secret: true},
	{env: "METRICS_ADDR", help: "address for /metrics, /livez and /readyz, e.g. 127.0.0.1:9090 (off when empty)"},
	{env: "METRICS_ENDPOINT_LABEL", def: "false", help: "add an endpoint-hash label to fluxora_webhook_deliveries_total"},
	{env: "PROFILE_DIR", help: "write cpu.pprof and allocs.pprof of this run into this directory at shutdown (profiling; off when empty)"},
}

// placeholder names a setting's value in -h: its choices where it has a few, else what the
// variable's name says it is, which it does for every setting.
func placeholder(env string) string {
	switch env {
	case "WEBHOOK_SIGNATURE_SCHEME":
		return "fluxora|standard"
	case "WEBHOOK_ORDERING":
		return "none|stream"
	case "WEBHOOK_ORDERING_FAILURE":
		return "skip|stop"
	case "LOG_LEVEL":
		return "debug|info|warn|error"
	case "LOG_FORMAT":
		return "json|console"
	case "WEBHOOK_409_DELIVERED", "METRICS_ENDPOINT_LABEL":
		return "true|false"
	case "WEBHOOK_PERMANENT_STATUSES":
		return "STATUSES"
	case "PORTAL_FRAME_ANCESTORS":
		return "ORIGINS"
	}
	switch {
	case strings.HasSuffix(env, "_URL"):
		return "URL"
	case strings.HasSuffix(env, "_MS"):
		return "MILLISECONDS"
	case strings.HasSuffix(env, "_SECRET") || strings.HasSuffix(env, "_PREVIOUS") || strings.HasSuffix(env, "_KEY"):
		return "SECRET"
	case strings.HasSuffix(env, "_SCHEDULE"):
		return "DURATIONS"
	case strings.HasSuffix(env, "_RETENTION") || strings.HasSuffix(env, "_AFTER"):
		return "DURATION"
	case strings.HasSuffix(env, "_SHARE"):
		return "FRACTION"
	case strings.HasSuffix(env, "_NETWORKS"):
		return "CIDRS"
	case strings.HasSuffix(env, "_ADDR"):
		return "HOST:PORT"
	case strings.HasSuffix(env, "_DIR"):
		return "DIR"
	}
	return "N" // the rest are counts and sizes (_SIZE, _BYTES, _RPS, _THRESHOLD, ...)
}

func flagName(env string) string { return strings.ReplaceAll(strings.ToLower(env), "_", "-") }

// loadSettings registers a flag per setting on fs, parses args, and returns the effective
// value of every variable: flag, else environment, else default. A secret setting can also
// come from a file, --NAME-file or NAME_FILE (see secretSettingValue), so that it appears
// neither on the command line nor in the environment; as a plain flag it is used with a
// warning on env's stderr.
func loadSettings(fs *flag.FlagSet, args []string, env *environment) (map[string]string, error) {
	return loadSettingsOf(settings, fs, args, env)
}

// loadSettingsOf is loadSettings for a command that reads only some of serve's settings
// (`fluxhook api`): its -h lists only those, and the others keep their defaults.
func loadSettingsOf(settings []setting, fs *flag.FlagSet, args []string, env *environment) (map[string]string, error) {
	flagged, files := map[string]*string{}, map[string]*string{}
	for _, s := range settings {
		name := flagName(s.env)
		flagged[s.env] = fs.String(name, "", s.help)
		cli.Document(fs, name, cli.FlagDoc{Placeholder: placeholder(s.env), Default: cmp.Or(s.def, s.shownDef), Env: s.env})
		if s.secret {
			files[s.env] = fs.String(name+"-file", "", "read "+s.env+" from this file (one trailing newline removed), keeping it off the command line")
			cli.Document(fs, name+"-file", cli.FlagDoc{Placeholder: "FILE", Env: s.env + "_FILE"})
		}
	}
	if err := noArguments(fs, args); err != nil {
		return nil, err
	}
	values := map[string]string{}
	var errs []error
	for _, s := range settings {
		v := *flagged[s.env]
		if s.secret {
			var err error
			if v, err = secretSettingValue(env, s, v, *files[s.env]); err != nil {
				errs = append(errs, err)
			}
		} else if v == "" {
			v = env.getenv(s.env)
		}
		if v == "" {
			v = s.def
		}
		values[s.env] = strings.TrimSpace(v)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w:\n%v", errInvalidConfig, errors.Join(errs...))
	}
	return values, nil
}

// serveConfig is everything `serve` needs besides the dispatcher's own config.
type serveConfig struct {
	dispatcher   dispatcher.Config
	drainTimeout time.Duration
	logLevel     zapcore.Level
	logFormat    string
	metricsAddr  string
	apiAddr      string
	apiDBURL     string
	publicURL    string
	frameAnc     []string
	profileDir   string
}

// parseServeConfig turns the raw values into a validated configuration, reporting every bad
// variable at once by name, so an operator fixes them in one go.
func parseServeConfig(v map[string]string) (serveConfig, error) {
	var errs []error
	bad := func(env, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", env, fmt.Sprintf(format, args...)))
	}
	intOf := func(env string, min int) int {
		raw := v[env]
		if raw == "" {
			return 0
		}
		n, err := strconv.Atoi(raw)
		if err != nil || n < min {
			bad(env, "must be an integer ≥ %d, got %q", min, raw)
			return 0
		}
		return n
	}
	msOf := func(env string, min int) time.Duration {
		return time.Duration(intOf(env, min)) * time.Millisecond
	}

	var c serveConfig
	d := &c.dispatcher
	d.DatabaseURL = v["DATABASE_URL"]
	d.ListenURL = v["DATABASE_LISTEN_URL"]
	d.DefaultURL = v["WEBHOOK_URL"]
	d.Secret = v["WEBHOOK_SECRET"]
	d.PreviousSecret = v["WEBHOOK_SECRET_PREVIOUS"]
	d.Scheme = sign.Scheme(v["WEBHOOK_SIGNATURE_SCHEME"])
	d.PollInterval = msOf("WEBHOOK_POLL_INTERVAL_MS", 10)
	d.BatchSize = intOf("WEBHOOK_BATCH_SIZE", 1)
	d.MaxInFlight = intOf("WEBHOOK_MAX_IN_FLIGHT", 1)
	d.EndpointConcurrency = intOf("WEBHOOK_ENDPOINT_CONCURRENCY", 1)
	d.Timeout = msOf("WEBHOOK_TIMEOUT_MS", 1)
	d.Lease = msOf("WEBHOOK_LEASE_MS", 1)
	c.drainTimeout = msOf("WEBHOOK_DRAIN_TIMEOUT_MS", 0)
	d.MaxPayloadBytes = intOf("WEBHOOK_MAX_PAYLOAD_BYTES", 2)
	d.RetryRPS = intOf("WEBHOOK_RETRY_RPS", 1)
	if v["WEBHOOK_RESPONSE_EXCERPT_BYTES"] != "" { // 0 means none, not the default: only empty does
		d.ResponseExcerptBytes = new(intOf("WEBHOOK_RESPONSE_EXCERPT_BYTES", 0))
	}
	switch r := v["WEBHOOK_409_DELIVERED"]; r {
	case "true", "1":
		d.Conflict409Delivered = new(true)
	case "false", "0":
		d.Conflict409Delivered = new(false)
	case "": // nil: each request's signature scheme decides
	default:
		bad("WEBHOOK_409_DELIVERED", "must be true or false (empty: true under the fluxora scheme, false under standard), got %q", r)
	}
	if r := v["WEBHOOK_PERMANENT_STATUSES"]; r != "" {
		statuses, err := send.ParsePermanentStatuses(r)
		if err != nil {
			bad("WEBHOOK_PERMANENT_STATUSES", "%v", strings.TrimPrefix(err.Error(), "WEBHOOK_PERMANENT_STATUSES: "))
		}
		d.PermanentStatuses = statuses
	}
	switch r := v["WEBHOOK_ORDERING"]; r {
	case "", "none":
	case "stream":
		d.Ordering = true
	default:
		bad("WEBHOOK_ORDERING", "must be none or stream, got %q", r)
	}
	switch r := v["WEBHOOK_ORDERING_FAILURE"]; r {
	case "", "skip":
	case "stop":
		d.OrderingStop = true
	default:
		bad("WEBHOOK_ORDERING_FAILURE", "must be skip or stop, got %q", r)
	}
	if r := v["WEBHOOK_RETRY_SHARE"]; r != "" {
		share, err := strconv.ParseFloat(r, 64)
		if err != nil || !(share > 0 && share <= 1) {
			bad("WEBHOOK_RETRY_SHARE", "must be a number more than 0 and at most 1 (e.g. 0.5), got %q", r)
		}
		d.RetryShare = share
	}
	d.BreakerThreshold = intOf("WEBHOOK_CIRCUIT_BREAKER_THRESHOLD", 0)
	d.BreakerReset = msOf("WEBHOOK_CIRCUIT_BREAKER_RESET_MS", 1)
	d.RedisURL = v["REDIS_URL"]
	c.metricsAddr = v["METRICS_ADDR"]
	c.apiAddr = v["API_ADDR"]
	c.apiDBURL = v["API_DATABASE_URL"]
	if c.publicURL = strings.TrimRight(v["API_PUBLIC_URL"], "/"); c.publicURL != "" {
		if u, err := url.Parse(c.publicURL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
			bad("API_PUBLIC_URL", "must be an http(s) URL such as https://hooks.example.com, got %q", c.publicURL)
		}
	}
	for _, o := range strings.FieldsFunc(v["PORTAL_FRAME_ANCESTORS"], func(r rune) bool { return r == ' ' || r == ',' }) {
		if o != "'self'" && !frameOrigin.MatchString(o) {
			bad("PORTAL_FRAME_ANCESTORS", "each entry must be an origin such as https://app.example.com, or 'self', got %q", o)
			continue
		}
		c.frameAnc = append(c.frameAnc, strings.TrimRight(o, "/"))
	}
	if c.apiDBURL != "" {
		if _, problem := parseDatabaseURL(c.apiDBURL); problem != "" {
			bad("API_DATABASE_URL", "%s", problem)
		}
	}
	c.profileDir = v["PROFILE_DIR"]
	if c.metricsAddr != "" {
		if _, _, err := net.SplitHostPort(c.metricsAddr); err != nil {
			bad("METRICS_ADDR", "must be host:port such as 127.0.0.1:9090 or :9090, got %q", c.metricsAddr)
		}
	}
	if c.apiAddr != "" {
		if _, _, err := net.SplitHostPort(c.apiAddr); err != nil {
			bad("API_ADDR", "must be host:port such as 127.0.0.1:8080 or :8080, got %q", c.apiAddr)
		}
	}
	switch v["METRICS_ENDPOINT_LABEL"] {
	case "true", "1":
		d.MetricsEndpointLabel = true
	case "false", "0", "":
	default:
		bad("METRICS_ENDPOINT_LABEL", "must be true or false, got %q", v["METRICS_ENDPOINT_LABEL"])
	}

	if _, problem := parseDatabaseURL(d.DatabaseURL); problem != "" {
		bad("DATABASE_URL", "%s", problem)
	}
	if d.ListenURL != "" {
		if _, err := pgx.ParseConfig(d.ListenURL); err != nil {
			bad("DATABASE_LISTEN_URL", "is not a valid PostgreSQL connection string (%s)", redactURL(err.Error()))
		}
	}
	if d.DefaultURL != "" && d.Secret == "" {
		bad("WEBHOOK_SECRET", "is required with WEBHOOK_URL: the secret consumers verify signatures with")
	}
	d.EncryptionKey = v["WEBHOOK_ENCRYPTION_KEY"]
	d.EncryptionKeyPrevious = v["WEBHOOK_ENCRYPTION_KEY_PREVIOUS"]
	if r := v["WEBHOOK_ENDPOINT_DISABLE_AFTER"]; r != "" {
		var dur sinceValue // whole days too, as dlq --since takes them
		if err := dur.Set(r); err != nil {
			bad("WEBHOOK_ENDPOINT_DISABLE_AFTER", "must be a positive duration such as 120h or 5d, got %q", r)
		}
		d.EndpointDisableAfter = time.Duration(dur)
	}
	sched, err := parseSchedule(v["WEBHOOK_RETRY_SCHEDULE"])
	if err != nil {
		bad("WEBHOOK_RETRY_SCHEDULE", "%v", err)
	}
	d.RetrySchedule = sched
	if r := v["WEBHOOK_RETENTION"]; r != "" {
		var dur sinceValue // whole days too, as dlq --since takes them
		if err := dur.Set(r); err != nil {
			bad("WEBHOOK_RETENTION", "must be a positive duration such as 168h or 7d, got %q", r)
		}
		d.Retention = time.Duration(dur)
	}
	if nets := v["WEBHOOK_ALLOWED_NETWORKS"]; nets != "" {
		allowed, err := send.ParseAllowedNetworks(nets)
		if err != nil {
			errs = append(errs, err) // its message starts with the variable's name
		}
		d.AllowedNetworks = allowed
	}
	if nets := v["WEBHOOK_ROW_URL_NETWORKS"]; nets != "" {
		allowed, err := send.ParseRowURLNetworks(nets)
		if err != nil {
			errs = append(errs, err) // its message starts with the variable's name
		}
		d.RowURLNetworks = allowed
	}
	level, err := zapcore.ParseLevel(v["LOG_LEVEL"])
	if err != nil {
		bad("LOG_LEVEL", "must be debug, info, warn or error, got %q", v["LOG_LEVEL"])
	}
	c.logLevel = level
	c.logFormat = v["LOG_FORMAT"]
	if c.logFormat != "json" && c.logFormat != "console" {
		bad("LOG_FORMAT", "must be json or console, got %q", c.logFormat)
	}
	if c.drainTimeout == 0 {
		c.drainTimeout = d.WithDefaults().Timeout + 5*time.Second
	}
	return c, errors.Join(errs...)
}

// frameOrigin is what PORTAL_FRAME_ANCESTORS takes: an origin (scheme, host of letters, digits,
// dots and dashes, an optional port), nothing that could end the CSP directive it is joined
// into (a ';') or widen it to every site (a lone '*').
var frameOrigin = regexp.MustCompile(`^https?://[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?/?$`)

// variableName finds the configuration variables an error message names.
var variableName = regexp.MustCompile(`\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b`)

// mergeConfigErrors adds to the errors of parseServeConfig those of dispatcher.New (ranges,
// URLs, secrets, REDIS_URL), so that an operator sees every bad variable in one go. A later
// error about a variable already reported is left out: a value that did not parse reaches
// the dispatcher as a zero and would be reported a second time, less clearly.
func mergeConfigErrors(parsed, built error) error {
	reported := map[string]bool{}
	for _, err := range flattenErrors(parsed) {
		reported[variableName.FindString(err.Error())] = true
	}
	errs := []error{parsed}
	for _, err := range flattenErrors(built) {
		// Each variable once, also when two of the dispatcher's own checks name it (its
		// validation and the signer's, for a bad signature scheme).
		if name := variableName.FindString(err.Error()); !reported[name] {
			errs = append(errs, err)
			reported[name] = name != ""
		}
	}
	return errors.Join(errs...)
}

// flattenErrors lists the leaves of a tree of errors.Join results.
func flattenErrors(err error) []error {
	if err == nil {
		return nil
	}
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return []error{err}
	}
	var out []error
	for _, e := range joined.Unwrap() {
		out = append(out, flattenErrors(e)...)
	}
	return out
}

// parseSchedule reads "5s,1m,5m" into durations.
func parseSchedule(raw string) ([]time.Duration, error) {
	if raw == "" {
		return nil, errors.New("must list at least one duration, e.g. 5s,1m,5m,30m")
	}
	var out []time.Duration
	for i, part := range strings.Split(raw, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(part))
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("step %d (%q) is not a positive duration such as 30s or 2h", i+1, strings.TrimSpace(part))
		}
		out = append(out, d)
	}
	return out, nil
}

// newLogger builds the zap logger: JSON for log shipping by default, console for humans,
// with sampling so that a failing endpoint cannot flood the log stack. The console format
// colours its levels only when color is set (see colorFor): escape codes in a file or a log
// collector's capture of stderr are noise.
func newLogger(level zapcore.Level, format string, w zapcore.WriteSyncer, color bool) *zap.Logger {
	encCfg := zap.NewProductionEncoderConfig()
	encCfg.TimeKey = "ts"
	encCfg.EncodeTime = zapcore.ISO8601TimeEncoder
	var enc zapcore.Encoder
	if format == "console" {
		encCfg.EncodeLevel = zapcore.CapitalLevelEncoder
		if color {
			encCfg.EncodeLevel = zapcore.CapitalColorLevelEncoder
		}
		enc = zapcore.NewConsoleEncoder(encCfg)
	} else {
		enc = zapcore.NewJSONEncoder(encCfg)
	}
	core := zapcore.NewCore(enc, w, level)
	core = zapcore.NewSamplerWithOptions(core, time.Second, 100, 10)
	return zap.New(core)
}

// colorFor says whether console logs written to w may be coloured: only on a terminal (a
// character device; /dev/null is one too, where it does not matter), and never when NO_COLOR
// is set to anything (no-color.org).
func colorFor(w io.Writer, getenv func(string) string) bool {
	if getenv("NO_COLOR") != "" {
		return false
	}
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// withComputedDefaults returns a copy of v with the settings whose defaults derive from others
// (the lease and the drain timeout, from the request timeout) set to the values in force, so
// that the startup line shows what this process runs with instead of a gap to work out.
func withComputedDefaults(v map[string]string, d dispatcher.Config, drain time.Duration) map[string]string {
	out := maps.Clone(v)
	if out["WEBHOOK_LEASE_MS"] == "" {
		out["WEBHOOK_LEASE_MS"] = strconv.FormatInt(d.Lease.Milliseconds(), 10)
	}
	if out["WEBHOOK_DRAIN_TIMEOUT_MS"] == "" {
		out["WEBHOOK_DRAIN_TIMEOUT_MS"] = strconv.FormatInt(drain.Milliseconds(), 10)
	}
	return out
}

// effectiveConfig lists the configuration for the startup log line, secrets redacted.
func effectiveConfig(v map[string]string) []zap.Field {
	fields := make([]zap.Field, 0, len(settings))
	for _, s := range settings {
		val := v[s.env]
		switch {
		case val == "":
			continue
		case s.env == "DATABASE_URL" || s.env == "DATABASE_LISTEN_URL" || s.env == "REDIS_URL":
			val = redactURL(val)
		case s.secret:
			val = "[redacted]"
		case s.env == "WEBHOOK_URL":
			// The URL may carry a token in its path, query or credentials: the line names
			// the consumer by its origin, as every delivery line's origin field does.
			if o := delivery.URLOrigin(val); o != "" {
				fields = append(fields, zap.String("webhook_url_origin", o))
			}
			continue
		}
		fields = append(fields, zap.String(strings.ToLower(s.env), val))
	}
	return fields
}
