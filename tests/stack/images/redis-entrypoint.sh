#!/bin/sh
# As the official image's: a command that starts with a flag is redis-server's; redis-server runs
# with protected mode off unless the command sets it.
set -e
case "$1" in -*) set -- redis-server "$@" ;; esac
if [ "$1" = redis-server ]; then
  case " $* " in *" --protected-mode "*) ;; *) set -- "$@" --protected-mode no ;; esac
fi
exec "$@"
