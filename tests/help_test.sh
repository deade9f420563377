#!/usr/bin/env bash
# `detr help VERB` prints exactly what `detr VERB --help` prints (stdout, exit 0) for every verb
# that `detr help` lists; an unknown verb is an error (exit 2). Usage: help_test.sh DETR
set -euo pipefail
detr=$1
verbs=$("$detr" help | sed -n 's/^  \([a-z]*\) .*/\1/p' | grep -v '^help$\|^version$')
[ "$(echo "$verbs" | wc -l)" -ge 8 ] || { echo "FAILED: too few verbs in 'detr help': $verbs"; exit 1; }
for verb in $verbs; do
  a=$("$detr" help "$verb") || { echo "FAILED: detr help $verb exited $?"; exit 1; }
  b=$("$detr" "$verb" --help) || { echo "FAILED: detr $verb --help exited $?"; exit 1; }
  [ "$a" = "$b" ] || { echo "FAILED: 'detr help $verb' differs from 'detr $verb --help'"; diff <(echo "$a") <(echo "$b"); exit 1; }
  case "$a" in "usage: detr $verb "*) ;; *) echo "FAILED: detr help $verb: $a"; exit 1 ;; esac
done
set +e
"$detr" help no-such-verb >/dev/null 2>&1
rc=$?
set -e
[ $rc = 2 ] || { echo "FAILED: detr help no-such-verb exited $rc, expected 2"; exit 1; }
echo "help_test: $(echo $verbs | wc -w) verbs ok"
