package pgtemp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Scratch is a database created on someone's server for one run of a command (the demo, the
// bench) and dropped after it: what the command does there never touches the databases it
// did not create, whatever else runs on the server.
type Scratch struct {
	// Name is the database's name, prefix_<12 hex digits>.
	Name string
	// URL is serverURL pointing at the database.
	URL       string
	serverURL string
}

// CreateScratch creates a database named prefix_<random> on the server serverURL names
// (connecting to serverURL's own database only to create it).
func CreateScratch(ctx context.Context, serverURL, prefix string) (*Scratch, error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	s := &Scratch{Name: prefix + "_" + hex.EncodeToString(b[:]), serverURL: serverURL}
	var err error
	if s.URL, err = WithDatabaseName(serverURL, s.Name); err != nil {
		return nil, err
	}
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return nil, fmt.Errorf("connecting to the server: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+s.Name); err != nil {
		return nil, fmt.Errorf("creating the database %s (the role needs CREATEDB): %w", s.Name, err)
	}
	return s, nil
}

// Drop removes the database, ending the sessions still in it.
func (s *Scratch) Drop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.serverURL)
	if err != nil {
		return fmt.Errorf("connecting to the server to drop %s: %w", s.Name, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+s.Name+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("dropping %s: %w", s.Name, err)
	}
	return nil
}

// WithDatabaseName returns the connection string u pointing at database name (a URL, or
// keyword/value settings, where the last setting wins).
func WithDatabaseName(u, name string) (string, error) {
	if !strings.Contains(u, "://") {
		return u + " dbname=" + name, nil
	}
	parsed, err := url.Parse(u)
	if err != nil {
		return "", fmt.Errorf("the database URL does not parse: %w", err)
	}
	parsed.Path = "/" + name
	return parsed.String(), nil
}
