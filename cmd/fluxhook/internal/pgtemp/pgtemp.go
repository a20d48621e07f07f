package pgtemp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrNoBinaries reports that the PostgreSQL server binaries were not found and could not be
// installed. Tests use it to skip on machines without PostgreSQL.
var ErrNoBinaries = errors.New("pgtemp: PostgreSQL server binaries (initdb, pg_ctl, postgres) not found")

// serverBinaries are what a directory must hold to run a cluster.
var serverBinaries = []string{"initdb", "pg_ctl", "postgres"}

// Options configures Start. The zero value is a fine default.
type Options struct {
	// Progress receives a line per slow step (installing, creating, starting) and apt-get's
	// output while installing. Nil discards them.
	Progress io.Writer
	// BinDir is the directory holding initdb, pg_ctl and postgres. Empty means search PATH,
	// then /usr/lib/postgresql/*/bin (highest version first).
	BinDir string
	// NoInstall forbids installing Debian's postgresql package when no binaries are found.
	NoInstall bool
	// Settings are extra server settings (name → value, unquoted), applied after the
	// defaults and so overriding them.
	Settings map[string]string
	// StartTimeout bounds each start and restart of the server; 0 means 60 s.
	StartTimeout time.Duration
}

// Cluster is a running throwaway cluster. Its methods are safe for concurrent use.
type Cluster struct {
	bin     string // directory of the server binaries
	dir     string // temporary directory: socket, log, data/
	data    string // data directory
	logFile string
	port    int
	// password is the postgres superuser's, generated for this cluster: every connection,
	// over TCP or the socket, must give it (scram-sha-256), so that no other local user can
	// connect as superuser while the cluster runs.
	password string
	runAs    *osUser // nil: run as the current user
	timeout  time.Duration

	mu      sync.Mutex
	stopped bool
}

// osUser is the account the server runs as when this process is root.
type osUser struct {
	name     string
	uid, gid uint32
}

// Start creates a cluster in a new temporary directory and starts it on a free port of
// 127.0.0.1. On error nothing is left running or on disk. Call Stop when done.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	progress := opts.Progress
	if progress == nil {
		progress = io.Discard
	}
	bin, err := binaries(ctx, opts, progress)
	if err != nil {
		return nil, err
	}
	runAs, err := serviceUser(ctx, progress)
	if err != nil {
		return nil, err
	}
	dir, err := makeDir(runAs)
	if err != nil {
		return nil, err
	}
	c := &Cluster{
		bin:     bin,
		dir:     dir,
		data:    filepath.Join(dir, "data"),
		logFile: filepath.Join(dir, "postgres.log"),
		runAs:   runAs,
		timeout: opts.StartTimeout,
	}
	if c.timeout <= 0 {
		c.timeout = 60 * time.Second
	}
	started := false
	defer func() {
		if !started {
			_ = c.Stop()
		}
	}()

	fmt.Fprintf(progress, "pgtemp: creating a cluster in %s with %s\n", dir, bin)
	if err := c.initdb(ctx); err != nil {
		return nil, err
	}
	if err := c.appendInclude(); err != nil {
		return nil, err
	}

	// A free port can be taken between asking and binding; try a few.
	for attempt := 1; ; attempt++ {
		if c.port, err = freePort(); err != nil {
			return nil, err
		}
		if err := c.writeSettings(opts.Settings); err != nil {
			return nil, err
		}
		_ = os.Truncate(c.logFile, 0) // a retry must not see the last attempt's errors
		out, err := c.run(ctx, "pg_ctl", "-D", c.data, "-l", c.logFile, "-w",
			"-t", strconv.Itoa(int(c.timeout/time.Second)), "start")
		if err == nil {
			break
		}
		serverLog := c.logTail()
		if attempt < 3 && ctx.Err() == nil && strings.Contains(serverLog, "could not bind") {
			continue
		}
		return nil, fmt.Errorf("pgtemp: pg_ctl start: %w\n%s\nserver log:\n%s", err, out, serverLog)
	}
	started = true
	fmt.Fprintf(progress, "pgtemp: PostgreSQL listening on 127.0.0.1:%d\n", c.port)
	return c, nil
}

// initdb creates the data directory with password authentication for every connection: the
// cluster listens on 127.0.0.1 and its superuser can run programs (COPY ... TO PROGRAM), so
// trust would hand that to every local user. The password goes to initdb in a file readable
// by the server's user alone, removed once initdb is done, never on a command line.
func (c *Cluster) initdb(ctx context.Context) error {
	raw := make([]byte, 24)
	if _, err := rand.Read(raw); err != nil {
		return fmt.Errorf("pgtemp: generating the superuser's password: %w", err)
	}
	c.password = hex.EncodeToString(raw)
	pwfile := filepath.Join(c.dir, "pwfile")
	if err := os.WriteFile(pwfile, []byte(c.password+"\n"), 0o600); err != nil {
		return fmt.Errorf("pgtemp: %w", err)
	}
	defer os.Remove(pwfile)
	if c.runAs != nil {
		if err := os.Chown(pwfile, int(c.runAs.uid), int(c.runAs.gid)); err != nil {
			return fmt.Errorf("pgtemp: %w", err)
		}
	}
	out, err := c.run(ctx, "initdb", "-D", c.data, "-U", "postgres", "-A", "scram-sha-256",
		"--pwfile="+pwfile, "-E", "UTF8", "--locale=C", "--no-sync")
	if err != nil {
		return fmt.Errorf("pgtemp: initdb: %w\n%s", err, out)
	}
	return nil
}

// URL is the connection URL of the cluster's postgres database, as the superuser postgres
// with its generated password. It is a credential: print it through a redacting function.
func (c *Cluster) URL() string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword("postgres", c.password),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)),
		Path:     "/postgres",
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// Port is the TCP port the server listens on, on 127.0.0.1. It stays the same across restarts.
func (c *Cluster) Port() int { return c.port }

// Dir is the temporary directory holding the cluster (data/, postgres.log and the socket).
func (c *Cluster) Dir() string { return c.dir }

// Restart stops the server with a fast shutdown (open connections are terminated) and starts
// it again on the same port, waiting until it accepts connections.
func (c *Cluster) Restart(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return errors.New("pgtemp: Restart after Stop")
	}
	out, err := c.run(ctx, "pg_ctl", "-D", c.data, "-l", c.logFile, "-m", "fast", "-w",
		"-t", strconv.Itoa(int(c.timeout/time.Second)), "restart")
	if err != nil {
		return fmt.Errorf("pgtemp: pg_ctl restart: %w\n%s\nserver log:\n%s", err, out, c.logTail())
	}
	return nil
}

// Stop stops the server at once (immediate shutdown) and removes the temporary directory.
// It is safe to call more than once; later calls do nothing and return nil.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return nil
	}
	c.stopped = true
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	if pid := c.postmasterPID(); pid > 0 {
		if out, err := c.run(ctx, "pg_ctl", "-D", c.data, "-m", "immediate", "-w", "stop"); err != nil {
			// pg_ctl failing must not leave a server running on a deleted directory.
			if kerr := syscall.Kill(pid, syscall.SIGKILL); kerr != nil && !errors.Is(kerr, syscall.ESRCH) {
				errs = append(errs, fmt.Errorf("pgtemp: pg_ctl stop: %w\n%s", err, out))
			}
		}
	}
	if err := os.RemoveAll(c.dir); err != nil {
		errs = append(errs, fmt.Errorf("pgtemp: removing %s: %w", c.dir, err))
	}
	return errors.Join(errs...)
}

// run runs one of the server binaries as the cluster's user and returns its combined output.
func (c *Cluster) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, name), args...)
	cmd.Dir = c.dir
	cmd.Env = serverEnv(c.dir)
	// pg_ctl leaves the server running with its output in the log file; WaitDelay keeps a
	// stray inherited pipe from blocking us forever.
	cmd.WaitDelay = 5 * time.Second
	if c.runAs != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Credential: &syscall.Credential{Uid: c.runAs.uid, Gid: c.runAs.gid},
		}
	}
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	return out.Bytes(), err
}

// serverEnv is the environment of the server binaries: ours without the libpq variables
// (PGDATA, PGPORT, ... would redirect them), with messages in English so that failures can
// be recognised.
func serverEnv(home string) []string {
	env := make([]string, 0, len(os.Environ())+3)
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "PG") || strings.HasPrefix(name, "LC_") || name == "LANG" || name == "HOME" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LANG=C", "LC_ALL=C", "HOME="+home)
}

// appendInclude makes postgresql.conf read pgtemp.conf last, so our settings win.
func (c *Cluster) appendInclude() error {
	f, err := os.OpenFile(filepath.Join(c.data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("pgtemp: %w", err)
	}
	_, err = fmt.Fprintf(f, "\n# Added by fluxhook's pgtemp.\ninclude 'pgtemp.conf'\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pgtemp: %w", err)
	}
	return nil
}

// writeSettings writes pgtemp.conf: a small, fast, non-durable development server.
func (c *Cluster) writeSettings(extra map[string]string) error {
	settings := [][2]string{
		{"listen_addresses", "127.0.0.1"},
		{"port", strconv.Itoa(c.port)},
		{"unix_socket_directories", c.dir},
		{"max_connections", "200"},
		{"shared_buffers", "64MB"},
		{"huge_pages", "off"},
		// Throwaway data: nothing needs to survive a machine crash. A process crash or an
		// immediate stop still loses nothing that was committed, because commits are still
		// written to the kernel before they are acknowledged (synchronous_commit stays on),
		// which is what fault tests that kill the server rely on.
		{"fsync", "off"},
		{"full_page_writes", "off"},
		{"wal_level", "minimal"},
		{"max_wal_senders", "0"},
		{"max_wal_size", "1GB"},
		// With no checkpoint for a long while, every 16 MB of WAL is a new segment file, and
		// zero-filling it stalls every commit behind it: about 50 ms, once every few
		// seconds at 1,000 events/s, which was the maximum of every steady bench run. A
		// long-running server recycles old segments instead; this makes new ones cheap.
		{"wal_init_zero", "off"},
		{"checkpoint_timeout", "30min"},
		// As docs/monitoring.md recommends for a busy queue: the outbox's dead tuples are
		// vacuumed within 10 s rather than a minute (at 3,000 events/s, about 25,000 dead
		// tuples and a 10 MB table instead of 200,000 and 100 MB).
		{"autovacuum_naptime", "10s"},
		{"jit", "off"},
		{"timezone", "UTC"},
		{"lc_messages", "C"},
	}
	names := make([]string, 0, len(extra))
	for name := range extra {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		settings = append(settings, [2]string{name, extra[name]})
	}
	var b strings.Builder
	b.WriteString("# Written by fluxhook's pgtemp: a throwaway development cluster.\n")
	for _, s := range settings {
		fmt.Fprintf(&b, "%s = '%s'\n", s[0], strings.ReplaceAll(s[1], "'", "''"))
	}
	path := filepath.Join(c.data, "pgtemp.conf")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("pgtemp: %w", err)
	}
	if c.runAs != nil {
		if err := os.Chown(path, int(c.runAs.uid), int(c.runAs.gid)); err != nil {
			return fmt.Errorf("pgtemp: %w", err)
		}
	}
	return nil
}

// postmasterPID is the server's process id from postmaster.pid, or 0 when it is not running.
func (c *Cluster) postmasterPID() int {
	b, err := os.ReadFile(filepath.Join(c.data, "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// logTail is the end of the server log, for error messages.
func (c *Cluster) logTail() string {
	b, err := os.ReadFile(c.logFile)
	if err != nil {
		return "(no server log)"
	}
	const limit = 4 << 10
	if len(b) > limit {
		b = b[len(b)-limit:]
	}
	return string(b)
}

// freePort asks the kernel for a free TCP port on 127.0.0.1.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtemp: finding a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("pgtemp: finding a free port: %w", err)
	}
	return port, nil
}

// makeDir creates the cluster's temporary directory, owned by the user the server runs as.
func makeDir(runAs *osUser) (string, error) {
	base := os.TempDir()
	// The server's user must reach the directory, and the socket path (dir/.s.PGSQL.NNNNN)
	// must fit in a sockaddr_un (107 bytes).
	if len(base) > 64 || (runAs != nil && !reachableByOthers(base)) {
		base = "/tmp"
	}
	dir, err := os.MkdirTemp(base, "fluxhook-pgtemp-")
	if err != nil {
		return "", fmt.Errorf("pgtemp: %w", err)
	}
	if runAs != nil {
		if err := os.Chown(dir, int(runAs.uid), int(runAs.gid)); err != nil {
			_ = os.RemoveAll(dir)
			return "", fmt.Errorf("pgtemp: giving %s to user %s: %w", dir, runAs.name, err)
		}
	}
	return dir, nil
}

// reachableByOthers reports whether every directory from / down to dir can be traversed by
// any user.
func reachableByOthers(dir string) bool {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	for {
		fi, err := os.Stat(dir)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return true
		}
		dir = parent
	}
}

// serviceUser is the account to run the server as: nil when this process is not root (the
// server runs as us), else the postgres user, created when missing, because PostgreSQL
// refuses to run as root.
func serviceUser(ctx context.Context, progress io.Writer) (*osUser, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	const name = "postgres"
	u, err := user.Lookup(name)
	var unknown user.UnknownUserError
	if errors.As(err, &unknown) {
		useradd, lerr := exec.LookPath("useradd")
		if lerr != nil {
			return nil, fmt.Errorf("pgtemp: PostgreSQL refuses to run as root and there is no %q user to run it as; create one (useradd --system %s)", name, name)
		}
		fmt.Fprintf(progress, "pgtemp: creating the system user %q to run PostgreSQL (it refuses to run as root)\n", name)
		cmd := exec.CommandContext(ctx, useradd, "--system", "--user-group", "--no-create-home",
			"--home-dir", "/var/lib/postgresql", "--shell", "/bin/bash", name)
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("pgtemp: PostgreSQL refuses to run as root and creating the %q user failed: %w\n%s", name, err, out)
		}
		u, err = user.Lookup(name)
	}
	if err != nil {
		return nil, fmt.Errorf("pgtemp: looking up the %q user: %w", name, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgtemp: user %q has uid %q: %w", name, u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgtemp: user %q has gid %q: %w", name, u.Gid, err)
	}
	if uid == 0 {
		return nil, fmt.Errorf("pgtemp: user %q has uid 0; PostgreSQL refuses to run as root", name)
	}
	return &osUser{name: name, uid: uint32(uid), gid: uint32(gid)}, nil
}

// FindBinaries returns the directory holding initdb, pg_ctl and postgres: the one of pg_ctl on
// PATH (following symlinks), else the highest version under /usr/lib/postgresql. The error
// wraps ErrNoBinaries.
func FindBinaries() (string, error) {
	var candidates []string
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if resolved, err := filepath.EvalSymlinks(p); err == nil {
			candidates = append(candidates, filepath.Dir(resolved))
		}
		candidates = append(candidates, filepath.Dir(p))
	}
	versioned, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(versioned, func(a, b string) int {
		return -compareVersions(filepath.Base(filepath.Dir(a)), filepath.Base(filepath.Dir(b)))
	})
	candidates = append(candidates, versioned...)
	for _, dir := range candidates {
		if hasServerBinaries(dir) {
			return dir, nil
		}
	}
	return "", fmt.Errorf("%w on PATH or in /usr/lib/postgresql/*/bin; install the PostgreSQL server "+
		"(Debian/Ubuntu: sudo apt-get install postgresql) or put the directory holding them on PATH", ErrNoBinaries)
}

// binaries returns the directory of the server binaries, installing them when allowed.
func binaries(ctx context.Context, opts Options, progress io.Writer) (string, error) {
	if opts.BinDir != "" {
		if !hasServerBinaries(opts.BinDir) {
			return "", fmt.Errorf("%w in %s (Options.BinDir)", ErrNoBinaries, opts.BinDir)
		}
		return opts.BinDir, nil
	}
	dir, err := FindBinaries()
	if err == nil || opts.NoInstall || os.Geteuid() != 0 {
		return dir, err
	}
	if err := install(ctx, progress); err != nil {
		return "", err
	}
	return FindBinaries()
}

// install installs Debian's postgresql package. A lock file serialises concurrent callers
// (test packages run in parallel processes); whoever comes second finds the binaries.
func install(ctx context.Context, progress io.Writer) error {
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "fluxhook-pgtemp-install.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("pgtemp: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("pgtemp: locking %s: %w", lock.Name(), err)
	}
	defer func() { _ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) }()
	if _, err := FindBinaries(); err == nil {
		return nil
	}
	aptGet, err := exec.LookPath("apt-get")
	if err != nil {
		return fmt.Errorf("%w, and apt-get is not available to install them; install the PostgreSQL server with your system's package manager", ErrNoBinaries)
	}
	fmt.Fprintln(progress, "pgtemp: PostgreSQL server binaries not found; installing Debian's postgresql package (apt-get update && apt-get install -y postgresql), this takes a minute")
	for _, args := range [][]string{
		{"update"},
		{"-o", "DPkg::Lock::Timeout=120", "install", "-y", "postgresql"},
	} {
		var tail tailBuffer
		cmd := exec.CommandContext(ctx, aptGet, args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		cmd.Stdout = io.MultiWriter(progress, &tail)
		cmd.Stderr = cmd.Stdout
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%w; apt-get %s failed: %w\n%s", ErrNoBinaries, strings.Join(args, " "), err, tail.String())
		}
	}
	fmt.Fprintln(progress, "pgtemp: installed PostgreSQL")
	return nil
}

// tailBuffer keeps the last few KiB written to it.
type tailBuffer struct{ b []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	const limit = 4 << 10
	t.b = append(t.b, p...)
	if len(t.b) > limit {
		t.b = t.b[len(t.b)-limit:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return string(t.b) }

func hasServerBinaries(dir string) bool {
	for _, name := range serverBinaries {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			return false
		}
	}
	return true
}

// compareVersions orders PostgreSQL version directory names ("9.6" < "15" < "17").
func compareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) || i < len(bs); i++ {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x - y
		}
	}
	return strings.Compare(a, b)
}
