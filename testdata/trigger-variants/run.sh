#!/bin/bash
# What forms of the wake-up cost single-row producers, without a dispatcher: pgbench runs of
# insert.sql against a database with fluxhook's schema (fluxhook migrate), the variants
# alternated round by round so that the machine's drift falls on all of them.
#
#   DB=postgres://root@127.0.0.1:5432/trigb testdata/trigger-variants/run.sh 8 4 5 none real default inline
#
# Arguments: clients, seconds per run, rounds, then variants:
#   none    no wake-up at all
#   real    schema 3's trigger, as installed: AFTER STATEMENT, its WHEN calling the STABLE
#           PL/pgSQL function webhook_outbox_notify_wanted()
#   replica the same, the producers' sessions in session_replication_role = replica
#   inline  the same trigger, the condition written into its WHEN (builtins only, no PL/pgSQL
#           until it holds; schema 2's form)
#   bare    the same trigger, its WHEN only pg_sequence_last_value(...) > 0 (the smallest
#           WHEN that reads the switch; it holds while the switch is set at all)
#   false   the same trigger, its WHEN a PL/pgSQL function that returns false: what a trigger
#           with a PL/pgSQL WHEN costs before it tests anything
#   seq     the same trigger, its WHEN a PL/pgSQL function that only reads the sequence
#   before  a BEFORE STATEMENT trigger without WHEN that tests the condition inside
#   default no trigger: an extra column whose DEFAULT is an inlined SQL function that tests the
#           condition and calls pg_notify when it holds (evaluated per row; planned with the
#           INSERT, so a prepared insert plans it once and an unprepared one every time)
#   expr    the same DEFAULT with the function's expression written into it
#   plpgsql the same DEFAULT as a STABLE PL/pgSQL function (not inlined: a call per row)
# PROTOCOL (simple, extended or prepared; default prepared) is pgbench's query mode: prepared is
# what a driver with a statement cache does (pgx, JDBC after a few uses), extended what
# node-postgres (the original's driver) does with a parameterised query, simple what psql and
# poolers in transaction mode often force. Every INSERT is planned in the last two.
# Each line also gives the server's CPU per transaction, in µs: the CPU of the backends that
# exited during the run (the postmaster's children's time, from /proc; PM=<postmaster pid> when
# the oldest process named postgres is not this server's postmaster). With the server
# saturated it moves with the throughput; it separates the server's cost from pgbench's.
# The schema's trigger is left as schema 3 made it at the end. The NOTIFY switch is reset (no
# dispatcher armed) first: run it on a database no dispatcher serves. Commits are asynchronous
# (synchronous_commit=off) so that a disk's flush time does not hide the CPU.
set -euo pipefail
here=$(dirname "$0")
db=${DB:?set DB to a database URL with fluxhook schema 3}
protocol=${PROTOCOL:-prepared}
pgbench=${PGBENCH:-$(ls /usr/lib/postgresql/*/bin/pgbench 2>/dev/null | tail -1)}
q() { PGOPTIONS="-c client_min_messages=warning" psql -Xq -v ON_ERROR_STOP=1 "$db" -c "$1" >/dev/null; }
clients=$1 secs=$2 rounds=$3; shift 3
for v in "$@"; do
  case $v in none|real|replica|inline|bare|false|seq|before|default|expr|plpgsql) ;;
  *) echo "unknown variant $v" >&2; exit 2 ;;
  esac
done
case $protocol in simple|extended|prepared) ;; *) echo "PROTOCOL must be simple, extended or prepared" >&2; exit 2 ;; esac
seq=$(psql -Atq "$db" -c "SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = 'webhook_outbox_notify_until'::regclass")
cond="to_timestamp(pg_sequence_last_value('$seq')::float8 / 1000) > statement_timestamp() AND current_setting('fluxhook.dispatcher', true) IS DISTINCT FROM 'on'"
notify="pg_notify('webhook_outbox', pg_current_xact_id()::text)"
trap restore EXIT
q "SELECT setval('$seq', 0, false)" # the switch as no dispatcher left it: every variant measures a busy or absent dispatcher
q "CREATE OR REPLACE FUNCTION fh_variant_false() RETURNS boolean LANGUAGE plpgsql STABLE AS \$b\$ BEGIN RETURN false; END \$b\$"
q "CREATE OR REPLACE FUNCTION fh_variant_seq() RETURNS boolean LANGUAGE plpgsql STABLE AS \$b\$ BEGIN RETURN pg_sequence_last_value('$seq') < 0; END \$b\$"
q "CREATE OR REPLACE FUNCTION fh_variant_before() RETURNS trigger LANGUAGE plpgsql AS \$b\$ BEGIN IF $cond THEN PERFORM $notify; END IF; RETURN NULL; END \$b\$"
q "CREATE OR REPLACE FUNCTION fh_variant_default() RETURNS boolean LANGUAGE sql VOLATILE AS \$b\$ SELECT CASE WHEN pg_current_xact_id() IS NOT NULL AND $cond THEN $notify::text IS NOT NULL END \$b\$"
q "CREATE OR REPLACE FUNCTION fh_variant_plpgsql() RETURNS boolean LANGUAGE plpgsql STABLE AS \$b\$ BEGIN IF pg_current_xact_id() IS NOT NULL AND $cond THEN PERFORM $notify; RETURN true; END IF; RETURN NULL; END \$b\$"
q "ALTER TABLE webhook_outbox ADD COLUMN IF NOT EXISTS fh_notify boolean"
when() { q "CREATE TRIGGER webhook_outbox_notify AFTER INSERT ON webhook_outbox FOR EACH STATEMENT WHEN ($1) EXECUTE FUNCTION webhook_outbox_notify()"; }
variant() {
  q "DROP TRIGGER IF EXISTS webhook_outbox_notify ON webhook_outbox"
  q "ALTER TABLE webhook_outbox ALTER COLUMN fh_notify DROP DEFAULT"
  case $1 in
  none) ;;
  real|replica) when "webhook_outbox_notify_wanted()" ;;
  inline) when "$cond" ;;
  bare) when "pg_sequence_last_value('$seq') > 0" ;;
  false) when "fh_variant_false()" ;;
  seq) when "fh_variant_seq()" ;;
  before) q "CREATE TRIGGER webhook_outbox_notify BEFORE INSERT ON webhook_outbox FOR EACH STATEMENT EXECUTE FUNCTION fh_variant_before()" ;;
  default) q "ALTER TABLE webhook_outbox ALTER COLUMN fh_notify SET DEFAULT fh_variant_default()" ;;
  expr) q "ALTER TABLE webhook_outbox ALTER COLUMN fh_notify SET DEFAULT CASE WHEN pg_current_xact_id() IS NOT NULL AND $cond THEN $notify::text IS NOT NULL END" ;;
  plpgsql) q "ALTER TABLE webhook_outbox ALTER COLUMN fh_notify SET DEFAULT fh_variant_plpgsql()" ;;
  *) echo "unknown variant $1" >&2; exit 2 ;;
  esac
}
restore() {
  set +e # undo as much as can be undone
  variant real
  q "ALTER TABLE webhook_outbox DROP COLUMN IF EXISTS fh_notify"
  q "DROP FUNCTION IF EXISTS fh_variant_false(), fh_variant_seq(), fh_variant_before(), fh_variant_default(), fh_variant_plpgsql()"
}
pm=${PM:-$(pgrep -o -x postgres || true)}
children() { if [ -n "$pm" ] && [ -r "/proc/$pm/stat" ]; then awk '{print $16 + $17}' "/proc/$pm/stat"; else echo 0; fi; }
tick=$(getconf CLK_TCK)
for r in $(seq "$rounds"); do
  for v in "$@"; do
    variant "$v"
    opts="-c synchronous_commit=off"
    [ "$v" = replica ] && opts="$opts -c session_replication_role=replica"
    c0=$(children)
    if ! out=$(PGOPTIONS="$opts" "$pgbench" -n -M "$protocol" -c "$clients" -j 2 -T "$secs" -f "$here/insert.sql" "$db" 2>&1); then
      printf 'pgbench failed on variant %s:\n%s\n' "$v" "$out" >&2
      exit 1
    fi
    # The backends' CPU reaches the postmaster's children's time once they have exited.
    for _ in $(seq 50); do
      [ "$(psql -XAtq "$db" -c "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgbench'")" = 0 ] && break
      sleep 0.02
    done
    c1=$(children)
    tps=$(grep -oP 'tps = \K[0-9.]+' <<<"$out" || true)
    txns=$(grep -oP 'number of transactions actually processed: \K[0-9]+' <<<"$out" || true)
    [ -n "$tps" ] && [ -n "$txns" ] && [ "$txns" -gt 0 ] || { printf 'no result from pgbench on variant %s:\n%s\n' "$v" "$out" >&2; exit 1; }
    cpu="n/a"
    [ "$c1" != 0 ] && cpu=$(awk -v d=$((c1 - c0)) -v t="$tick" -v n="$txns" 'BEGIN { printf "%.1f", d / t * 1e6 / n }')
    echo "clients=$clients protocol=$protocol round=$r $v $tps tps, server CPU $cpu µs per transaction"
  done
  q "TRUNCATE webhook_outbox"
done
