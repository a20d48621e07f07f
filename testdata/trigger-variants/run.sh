#!/bin/bash
# What forms of the wake-up trigger cost single-row producers, without a dispatcher: pgbench
# runs of insert.sql against a database with fluxhook's schema (fluxhook migrate), the
# variants alternated round by round so that the machine's drift falls on all of them.
#
#   DB=postgres://root@127.0.0.1:5432/trigb testdata/trigger-variants/run.sh 8 6 5 none real false seq before
#
# Arguments: clients, seconds per run, rounds, then variants:
#   none    no trigger
#   replica schema 3's trigger, producers' sessions in session_replication_role = replica
#   real    schema 3's trigger (AFTER STATEMENT, WHEN calling webhook_outbox_notify_wanted())
#   false   the same trigger, its WHEN a PL/pgSQL function that returns false
#   seq     the same trigger, its WHEN a PL/pgSQL function that only reads the sequence
#   before  BEFORE STATEMENT, no WHEN, schema 3's condition inside the trigger function
#   default no trigger: a column whose DEFAULT is an inlined SQL function that tests schema
#           3's condition and calls pg_notify when it holds (evaluated per row, not per
#           statement)
# The schema's trigger is left as schema 3 made it at the end. Commits are asynchronous
# (synchronous_commit=off) so that a disk's flush time does not hide the CPU.
set -euo pipefail
here=$(dirname "$0")
db=${DB:?set DB to a database URL with fluxhook schema 3}
pgbench=${PGBENCH:-$(ls /usr/lib/postgresql/*/bin/pgbench 2>/dev/null | tail -1)}
seq=$(psql -Atq "$db" -c "SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = 'webhook_outbox_notify_until'::regclass")
cond="to_timestamp(pg_sequence_last_value('$seq')::float8 / 1000) > statement_timestamp() AND current_setting('fluxhook.dispatcher', true) IS DISTINCT FROM 'on'"
q() { psql -Xq "$db" -c "$1" >/dev/null; }
when() { q "CREATE TRIGGER webhook_outbox_notify AFTER INSERT ON webhook_outbox FOR EACH STATEMENT WHEN ($1()) EXECUTE FUNCTION webhook_outbox_notify()"; }
variant() {
  q "DROP TRIGGER IF EXISTS webhook_outbox_notify ON webhook_outbox"
  q "ALTER TABLE webhook_outbox DROP COLUMN IF EXISTS fh_notify"
  case $1 in
  none) ;;
  real|replica) when webhook_outbox_notify_wanted ;;
  false) q "CREATE OR REPLACE FUNCTION fh_variant_false() RETURNS boolean LANGUAGE plpgsql STABLE AS \$b\$ BEGIN RETURN false; END \$b\$"
         when fh_variant_false ;;
  seq) q "CREATE OR REPLACE FUNCTION fh_variant_seq() RETURNS boolean LANGUAGE plpgsql STABLE AS \$b\$ BEGIN RETURN pg_sequence_last_value('$seq') < 0; END \$b\$"
       when fh_variant_seq ;;
  before) q "CREATE OR REPLACE FUNCTION fh_variant_before() RETURNS trigger LANGUAGE plpgsql AS \$b\$ BEGIN IF $cond THEN PERFORM pg_notify('webhook_outbox', pg_current_xact_id()::text); END IF; RETURN NULL; END \$b\$"
          q "CREATE TRIGGER webhook_outbox_notify BEFORE INSERT ON webhook_outbox FOR EACH STATEMENT EXECUTE FUNCTION fh_variant_before()" ;;
  default) q "CREATE OR REPLACE FUNCTION fh_variant_default() RETURNS boolean LANGUAGE sql VOLATILE AS \$b\$ SELECT CASE WHEN $cond THEN pg_notify('webhook_outbox', pg_current_xact_id()::text)::text IS NOT NULL END \$b\$"
           q "ALTER TABLE webhook_outbox ADD COLUMN fh_notify boolean DEFAULT fh_variant_default()" ;;
  *) echo "unknown variant $1" >&2; exit 2 ;;
  esac
}
trap 'variant real' EXIT
clients=$1 secs=$2 rounds=$3; shift 3
for r in $(seq "$rounds"); do
  for v in "$@"; do
    variant "$v"
    opts="-c synchronous_commit=off"
    [ "$v" = replica ] && opts="$opts -c session_replication_role=replica"
    tps=$(PGOPTIONS="$opts" "$pgbench" -n -M prepared -c "$clients" -j 2 -T "$secs" -f "$here/insert.sql" "$db" 2>&1 | grep -oP 'tps = \K[0-9.]+')
    echo "clients=$clients round=$r $v $tps"
  done
  q "TRUNCATE webhook_outbox"
done
