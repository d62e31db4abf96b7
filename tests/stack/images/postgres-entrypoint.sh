#!/bin/bash
# The official postgres image's start, in short (docs: "Initialization scripts", "Environment
# Variables"), run as root and dropping to the postgres user.
set -euo pipefail
if [[ "$1" != postgres ]]; then exec "$@"; fi
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"; }
mkdir -p "$PGDATA" /var/run/postgresql
chown postgres:postgres "$PGDATA" /var/run/postgresql
chmod 0700 "$PGDATA"
if [[ ! -s "$PGDATA/PG_VERSION" ]]; then
  : "${POSTGRES_PASSWORD:?the postgres stand-in needs POSTGRES_PASSWORD}"
  export POSTGRES_USER="${POSTGRES_USER:-postgres}" POSTGRES_DB="${POSTGRES_DB:-${POSTGRES_USER:-postgres}}"
  pwfile="$(mktemp)"; printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"; chown postgres "$pwfile"
  # UTF8 as the official image (a C-locale initdb would give SQL_ASCII, which Airflow cannot store
  # the example DAGs' text in)
  as_postgres initdb -D "$PGDATA" -E UTF8 --locale=C.UTF-8 --username="$POSTGRES_USER" \
    --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  as_postgres pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start
  if [[ "$POSTGRES_DB" != postgres ]]; then
    as_postgres psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
      -c "CREATE DATABASE \"$POSTGRES_DB\""
  fi
  for f in /docker-entrypoint-initdb.d/*; do
    case "$f" in
      *.sh) echo "init: running $f"; as_postgres env PGUSER="$POSTGRES_USER" bash "$f" ;;
      *.sql) echo "init: running $f"; as_postgres psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" -f "$f" ;;
      *) [[ -e "$f" ]] && echo "init: ignoring $f" ;;
    esac
  done
  as_postgres pg_ctl -D "$PGDATA" -m fast -w stop
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups -- postgres -D "$PGDATA" -c listen_addresses='*' "${@:2}"
