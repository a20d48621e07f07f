// Package sql holds fluxhook's schema as numbered, embedded migrations and the code that
// applies them.
//
// The same files are what `fluxhook migrate --print` writes out for users who install by
// `psql -f`: each migration is idempotent and records its own version, so the printed script
// and the Go migrator install exactly the same schema. The package name shadows database/sql;
// importers alias it (by convention `fluxsql`).
package sql
