#!/usr/bin/env bash
# Debian packages the project needs, installed only when missing (idempotent, no-op when present).
set -euo pipefail

need=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
# Browser tests drive Debian's Chromium (Playwright is pointed at it: no browser download).
[ -x /usr/bin/chromium ] || need+=(chromium)
[ -x /usr/bin/chromedriver ] || need+=(chromium-driver)
# The Celery end-to-end test's broker (started by the test on 127.0.0.1, never as a service).
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)

if ((${#need[@]})); then
  echo "system-deps: installing ${need[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${need[@]}"
else
  echo "system-deps: all present"
fi
