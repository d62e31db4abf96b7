#!/usr/bin/env bash
# Entry point of every container built from docker/Dockerfile (PID 1 is tini, which runs this).
#
# Spark nodes tell each other where to connect back by host name: a worker registers its own with
# the master, a spark-submit driver (in an Airflow container) gives its own to the executors. In a
# container that name is the container id, which the other containers may not resolve; its IP
# address they always reach. So advertise the IP unless the service chose a name itself (or the
# only address found is loopback, which would be worse than the default).
set -euo pipefail

if [[ -z "${SPARK_LOCAL_HOSTNAME:-}" ]]; then
  ip="$(hostname -i 2>/dev/null | awk '{print $1}' || true)"
  if [[ -n "${ip}" && "${ip}" != 127.* && "${ip}" != "::1" ]]; then
    export SPARK_LOCAL_HOSTNAME="${ip}"
  fi
fi

exec "$@"
