// Package pgtemp starts a throwaway PostgreSQL cluster: its own data directory in a temporary
// directory (mode 0700), a free port on 127.0.0.1, durability switched off for speed. Every
// connection, over TCP or the Unix socket, must authenticate (scram-sha-256) as the superuser
// postgres with a password generated for the cluster and known only through [Cluster.URL]:
// other local users can reach the port, and a superuser can run programs on the host. The demo uses it so that `fluxhook demo` needs nothing but the server binaries, and
// fault tests use it because they restart PostgreSQL, which they must not do to a shared
// server.
//
// Start finds the server binaries (initdb, pg_ctl, postgres) on PATH or under
// /usr/lib/postgresql/*/bin, preferring the highest version. When they are missing and the
// process runs as root, it installs Debian's postgresql package with apt-get; otherwise it
// returns an error wrapping ErrNoBinaries that says what to install.
//
// PostgreSQL refuses to run as root, so as root the cluster is created and run as the
// `postgres` operating-system user (created with useradd when it does not exist), and its
// directory is chowned to that user.
//
//	c, err := pgtemp.Start(ctx, pgtemp.Options{Progress: os.Stderr})
//	if err != nil { ... }
//	defer c.Stop()
//	pool, err := pgxpool.New(ctx, c.URL())
package pgtemp
