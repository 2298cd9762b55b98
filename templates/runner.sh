#!/bin/sh
# cloudtrain job runner: the same file on every node (local, SSH, every cloud).
#
#   runner.sh start  JOBDIR   start JOBDIR/cmd.sh detached, in its own session; print the pid
#   runner.sh status JOBDIR   print one JSON line: state, pid, exit_code, started_at, ended_at
#   runner.sh kill   JOBDIR   TERM the job's process group, KILL it after a grace period
#
# JOBDIR holds cmd.sh (the job) and env.sh (exported variables, mode 0600). The runner writes
# pid, started_at, log (stdout+stderr), exit_code and ended_at. exit_code is written atomically
# last, so its presence means the job is over. The job survives the CLI and SSH going away.
set -u

mode=${1:?usage: runner.sh start|status|kill JOBDIR}
jobdir=${2:?usage: runner.sh start|status|kill JOBDIR}

now() { date +%s; }

case "$mode" in
start)
    [ -f "$jobdir/cmd.sh" ] || { echo "runner: $jobdir/cmd.sh missing" >&2; exit 2; }
    if [ -f "$jobdir/pid" ]; then echo "runner: job in $jobdir was already started" >&2; exit 3; fi
    # setsid gives the job its own session and process group, so neither a closed SSH session
    # nor Ctrl-C in the CLI reaches it; only `runner.sh kill` (or a stopped VM) ends it.
    setsid sh "$0" _supervise "$jobdir" </dev/null >/dev/null 2>&1 &
    i=0
    while [ ! -s "$jobdir/pid" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
    [ -s "$jobdir/pid" ] || { echo "runner: job did not start" >&2; exit 4; }
    cat "$jobdir/pid"
    ;;
_supervise)
    cd "$jobdir" || exit 1
    echo $$ > pid.tmp && mv pid.tmp pid
    now > started_at
    child=
    finish() {
        code=$1
        now > ended_at
        echo "$code" > exit_code.tmp && mv exit_code.tmp exit_code
        exit 0
    }
    trap '[ -n "$child" ] && kill -TERM "$child" 2>/dev/null; wait "$child" 2>/dev/null; finish 143' TERM INT HUP
    (
        [ -f env.sh ] && . ./env.sh
        cd "${CLOUDTRAIN_WORKDIR:-.}" || exit 1
        exec sh "$jobdir/cmd.sh"
    ) >> log 2>&1 &
    child=$!
    wait "$child"
    finish $?
    ;;
status)
    pid=$(cat "$jobdir/pid" 2>/dev/null || true)
    started=$(cat "$jobdir/started_at" 2>/dev/null || true)
    ended=$(cat "$jobdir/ended_at" 2>/dev/null || true)
    code=$(cat "$jobdir/exit_code" 2>/dev/null || true)
    if [ -n "$code" ]; then
        if [ "$code" = 0 ]; then state=succeeded; elif [ "$code" = 143 ]; then state=killed; else state=failed; fi
    elif [ -z "$pid" ]; then
        state=pending
    elif kill -0 "$pid" 2>/dev/null; then
        state=running
    else
        # The supervisor is gone without writing an exit code: the node rebooted or was killed.
        state=lost
    fi
    size=$(wc -c < "$jobdir/log" 2>/dev/null || echo 0)
    printf '{"state":"%s","pid":%s,"exit_code":%s,"started_at":%s,"ended_at":%s,"log_bytes":%s}\n' \
        "$state" "${pid:-null}" "${code:-null}" "${started:-null}" "${ended:-null}" "$size"
    ;;
kill)
    pid=$(cat "$jobdir/pid" 2>/dev/null || true)
    [ -n "$pid" ] || exit 0
    [ -f "$jobdir/exit_code" ] && exit 0
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    i=0
    while [ ! -f "$jobdir/exit_code" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    if [ ! -f "$jobdir/exit_code" ]; then
        kill -KILL -- "-$pid" 2>/dev/null || true
        now > "$jobdir/ended_at"
        echo 137 > "$jobdir/exit_code.tmp" && mv "$jobdir/exit_code.tmp" "$jobdir/exit_code"
    fi
    ;;
*)
    echo "runner: unknown mode $mode" >&2
    exit 2
    ;;
esac
