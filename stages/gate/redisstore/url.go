package redisstore

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultDialTimeout is the connect timeout when REDIS_URL does not set dial_timeout: shorter
// than go-redis's 5 s, because the gate sits in the delivery path and fails open instead of
// waiting for a Redis that does not answer.
const DefaultDialTimeout = time.Second

// NewClient returns a client for REDIS_URL: a single node, a Sentinel-managed primary, or a
// Redis Cluster, parsed by go-redis's own URL parsers. The accepted forms:
//
//	redis://[user:password@]host[:port][/db][?options]     single node (port 6379, db 0 by default)
//	rediss://...                                           the same over TLS
//	unix://[user:password@]/path/to/redis.sock[?db=N]      single node on a Unix socket
//	redis://[user:password@]sentinel1:26379[/db]?master_name=NAME[&addr=sentinel2:26379...]
//	                                                       Sentinel: the host and every addr= are
//	                                                       sentinels; the user info authenticates
//	                                                       to the sentinels, and username= and
//	                                                       password= to the primary
//	redis://[user:password@]node1:6379?cluster=true[&addr=node2:6379...]
//	                                                       Cluster: the host and every addr= are
//	                                                       seed nodes (database 0 only)
//
// rediss:// works for Sentinel and Cluster too. Other query options are go-redis's, in snake
// case (dial_timeout=2s, read_timeout=1s, pool_size=20, skip_verify=true, ...); unknown ones
// are an error. cluster= is ours and is removed before go-redis parses the rest.
//
// Unless the URL says otherwise: dial_timeout is DefaultDialTimeout, a connection is dialled
// once per attempt (dialer_retries), and commands are never retried by the client
// (max_retries, when positive, is honoured), because a script that may
// have run must not run twice: the gate fails open for that batch instead. Context deadlines
// are always honoured, so the gate's store timeout bounds every call.
//
// Errors start with "REDIS_URL:" and never repeat the URL, which may hold a password.
func NewClient(redisURL string) (redis.UniversalClient, error) {
	if redisURL == "" {
		return nil, errors.New("REDIS_URL: is empty")
	}
	u, err := url.Parse(redisURL)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err // url.Error repeats the URL, password included
		}
		return nil, fmt.Errorf("REDIS_URL: not a URL: %w", err)
	}
	q := u.Query()
	cluster := false
	if q.Has("cluster") {
		cluster, err = strconv.ParseBool(q.Get("cluster"))
		if err != nil {
			return nil, fmt.Errorf("REDIS_URL: cluster=%q is not a boolean", q.Get("cluster"))
		}
		q.Del("cluster")
		u.RawQuery = q.Encode()
		redisURL = u.String()
	}
	bad := func(err error) error { return fmt.Errorf("REDIS_URL: %w", err) }
	switch {
	case cluster && q.Has("master_name"):
		return nil, errors.New("REDIS_URL: cluster=true and master_name= cannot be combined (Sentinel-managed clusters are not supported)")
	case cluster:
		if p := strings.Trim(u.Path, "/"); p != "" && p != "0" {
			return nil, fmt.Errorf("REDIS_URL: Redis Cluster has only database 0, the URL names database %q", p)
		}
		u.Path = ""
		opt, err := redis.ParseClusterURL(u.String())
		if err != nil {
			return nil, bad(err)
		}
		opt.DialTimeout = or(opt.DialTimeout, DefaultDialTimeout)
		opt.MaxRetries = noRetries(opt.MaxRetries)
		opt.DialerRetries = or1(opt.DialerRetries)
		opt.ContextTimeoutEnabled = true
		return redis.NewClusterClient(opt), nil
	case q.Has("master_name"):
		opt, err := redis.ParseFailoverURL(redisURL)
		if err != nil {
			return nil, bad(err)
		}
		opt.DialTimeout = or(opt.DialTimeout, DefaultDialTimeout)
		opt.MaxRetries = noRetries(opt.MaxRetries)
		opt.DialerRetries = or1(opt.DialerRetries)
		opt.ContextTimeoutEnabled = true
		return redis.NewFailoverClient(opt), nil
	case q.Has("addr"):
		return nil, errors.New("REDIS_URL: addr= names more nodes, which needs master_name= (Sentinel) or cluster=true (Cluster)")
	default:
		opt, err := redis.ParseURL(redisURL)
		if err != nil {
			return nil, bad(err)
		}
		opt.DialTimeout = or(opt.DialTimeout, DefaultDialTimeout)
		opt.MaxRetries = noRetries(opt.MaxRetries)
		opt.DialerRetries = or1(opt.DialerRetries)
		opt.ContextTimeoutEnabled = true
		return redis.NewClient(opt), nil
	}
}

func or(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// or1 keeps a positive dialer_retries from the URL and otherwise dials once per attempt
// (go-redis dials 5 times by default, which would multiply the gate's wait on a Redis that
// is down; the gate itself tries again after its StoreRetry).
func or1(n int) int {
	if n > 0 {
		return n
	}
	return 1
}

// noRetries keeps a positive max_retries from the URL and otherwise disables retries (-1 in
// go-redis; 0 would mean its default of 3).
func noRetries(n int) int {
	if n > 0 {
		return n
	}
	return -1
}
