#!/usr/bin/env bash
# Debian packages the container stack test needs (make test-stack), installed only when missing:
# podman and runc run the containers (tests/stack/containers.conf picks runc: Debian's default,
# crun, fails on these machines), debootstrap builds the base image (no registry serves one).
set -euo pipefail

need=()
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v runc >/dev/null 2>&1 || need+=(runc)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)

if ((${#need[@]})); then
  echo "stack-deps: installing ${need[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${need[@]}"
else
  echo "stack-deps: all present"
fi
