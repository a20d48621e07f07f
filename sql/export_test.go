package sql

// MigrateLockKey lets the tests of package sql_test stand in for a migration in progress.
const MigrateLockKey = migrateLockKey
