#!/bin/sh
# The one use compose.yaml makes of Kafka's kafka-topics.sh (its healthcheck): --list, asked of
# the broker over Kafka's protocol by Tansu's own client.
set -e
server=localhost:9092
while [ $# -gt 0 ]; do
  case "$1" in
    --bootstrap-server) server=$2; shift 2 ;;
    --list) list=1; shift ;;
    *) echo "kafka-topics.sh stand-in: only --bootstrap-server HOST:PORT --list" >&2; exit 2 ;;
  esac
done
[ -n "$list" ] || { echo "kafka-topics.sh stand-in: only --list" >&2; exit 2; }
exec /usr/local/bin/tansu topic list --broker "tcp://$server"
