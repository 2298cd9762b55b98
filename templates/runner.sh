#!/bin/sh
# cloudtrain job runner: the same file on every node (local, SSH, every cloud).
#
#   runner.sh start    JOBDIR [GRACE [DEADLINE]]
#                                     start JOBDIR/cmd.sh detached, in its own session; print the pid.
#                                     DEADLINE (whole seconds, optional): the supervisor ends the job
#                                     then, on the node, whatever happens to the CLI: TERM, KILL after
#                                     GRACE, exit code 124 (state failed), a line in the log
#   runner.sh status   JOBDIR         print one JSON line: state, pid, exit_code, started_at, ended_at
#   runner.sh kill     JOBDIR [GRACE] end the job and everything it started: TERM, then KILL after
#                                     GRACE seconds (default 10); print its final status line
#                                     (nothing for a job dir that does not exist)
#   runner.sh kill-all JOBSDIR [GRACE] kill every job under JOBSDIR (used by `down` and `cancel`)
#   runner.sh follow   JOBDIR OFFSET [EVENTS]
#                                     print the log from byte OFFSET as it grows; return once the job
#                                     is over and all of it is printed (checked every 50 ms on the node).
#                                     With EVENTS (a byte offset into JOBDIR/progress) the job's progress
#                                     events come too, and every piece is framed: "L N\n" or "P N\n",
#                                     then N bytes of the log or of the events
#
# JOBDIR holds cmd.sh (the job) and env.sh (exported variables, mode 0600). The runner writes
# pid, started_at, log (stdout+stderr), exit_code and ended_at. exit_code is written atomically
# last, so its presence means the job and every process it started are over. The job survives
# the CLI and SSH going away. The job may append its progress events to CLOUDTRAIN_PROGRESS_FILE
# (JOBDIR/progress: one JSON object per line, cloudtrain's progress protocol), beside its log,
# which stays the job's own words for people.
#
# What "everything it started" means: the supervisor is a session leader (setsid), so the job and
# its descendants share its session id even when they make process groups of their own. A job's
# leftovers (`server &` then exit) are ended when the job ends, like systemd's control-group
# kill mode; a process that calls setsid() itself escapes, as it would escape any session.
# Every job process also carries CLOUDTRAIN_JOB_DIR in its environment; once the supervisor is
# gone (so its pid, which is the session id, could be reused) only processes carrying that mark
# are signalled.
set -u

mode=${1:?usage: runner.sh start|status|kill|kill-all JOBDIR}
jobdir=${2:?usage: runner.sh start|status|kill|kill-all JOBDIR}
grace=${3:-10}

now() { date +%s; }

# A process's identity beyond its pid: BOOT:PID:TICKS (the boot id, the pid, its start time in clock
# ticks after boot; BOOT and TICKS empty without /proc). A pid alone lies after a reboot or once it
# is reused: a lost job would read as running (autostop never fires) and `kill` could reach a
# stranger's session. cloudtrain/procid.py writes and reads the same format on the laptop.
proc_identity() {
    ident_pid=$1
    boot=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null || true)
    ticks=
    stat=$(cat "/proc/$1/stat" 2>/dev/null || true)
    if [ -n "$stat" ]; then
        # The command name (field 2) may hold spaces and ')': fields after its last ')'. The 20th
        # of those is field 22, the start time.
        set -- ${stat##*) }
        if [ $# -ge 20 ]; then shift 19; ticks=$1; fi
    fi
    echo "$boot:$ident_pid:$ticks"
}

# Whether the job's supervisor (pid $1) still runs: the same process that started the job, by its
# recorded identity (jobs started before identities were recorded: the pid alone).
supervisor_alive() {
    kill -0 "$1" 2>/dev/null || return 1
    # A zombie has ended (only its exit status is left for a parent that never asks).
    case $(cat "/proc/$1/stat" 2>/dev/null || true) in *") Z "*) return 1 ;; esac
    recorded=$(cat "$jobdir/identity" 2>/dev/null || true)
    [ -n "$recorded" ] || return 0
    [ "$(proc_identity "$1")" = "$recorded" ]
}

# Sets $members: the pids in session $1 except this shell and zombies. Builtins only (no
# command substitution): a subshell of ours would be a member of the session it is listing.
list_session() {
    want=$1
    members=""
    if [ -r /proc/self/stat ]; then
        for d in /proc/[0-9]*; do
            p=${d#/proc/}
            [ "$p" = "$$" ] && continue
            stat=""
            read -r stat 2>/dev/null < "$d/stat" || [ -n "$stat" ] || continue
            # After the last ") " come state, ppid, pgrp, session (the command name before it may
            # contain spaces and parentheses).
            rest=${stat##*) }
            set -f
            # shellcheck disable=SC2086
            set -- $rest
            set +f
            [ "${4:-}" = "$want" ] || continue
            [ "$1" = Z ] && continue  # exited already; only waits to be reaped
            members="$members $p"
        done
    else
        # No /proc (macOS): ps, run in the background so that its own pid is known and skipped.
        listing="$jobdir/.session.$$"
        ps -A -o pid= -o sess= -o stat= > "$listing" 2>/dev/null &
        pspid=$!
        wait "$pspid"
        while read -r p s st; do
            [ "$s" = "$want" ] && [ "$p" != "$$" ] && [ "$p" != "$pspid" ] || continue
            case $st in Z*) continue ;; esac
            members="$members $p"
        done < "$listing"
        rm -f "$listing"
    fi
}

has_mark() {
    [ -r "/proc/$1/environ" ] && tr '\0' '\n' < "/proc/$1/environ" 2>/dev/null | grep -qxF "CLOUDTRAIN_JOB_DIR=$jobdir"
}

# Sets $found: the job's processes in session $1. $2=1 while the supervisor (pid $1) lives, so
# the session id is still its own: then every member counts; otherwise only marked processes.
find_job_processes() {
    list_session "$1"
    found=""
    for p in $members; do
        if [ "$2" = 1 ] || has_mark "$p"; then found="$found $p"; fi
    done
}

signal_found() {
    for p in $found; do kill "-$1" "$p" 2>/dev/null; done
    return 0
}

# TERM the job's processes ($1 session, $2 as above), KILL what is left after $grace seconds.
end_processes() {
    find_job_processes "$1" "$2"
    [ -n "$found" ] || return 0
    signal_found TERM
    i=0
    while [ $i -lt $((grace * 10)) ]; do
        sleep 0.1
        i=$((i + 1))
        find_job_processes "$1" "$2"
        [ -n "$found" ] || return 0
    done
    signal_found KILL
}

# One JSON line: state, pid, exit_code, started_at, ended_at, log_bytes (`status`, and `kill`'s answer).
print_status() {
    pid=$(cat "$jobdir/pid" 2>/dev/null || true)
    # Whether the supervisor lives is asked before exit_code is read: it writes exit_code, then
    # exits. Read the other way round, a job ending between the two reads would be "lost".
    alive=0
    if [ -n "$pid" ] && supervisor_alive "$pid"; then alive=1; fi
    started=$(cat "$jobdir/started_at" 2>/dev/null || true)
    ended=$(cat "$jobdir/ended_at" 2>/dev/null || true)
    code=$(cat "$jobdir/exit_code" 2>/dev/null || true)
    if [ -n "$code" ]; then
        # killed: ended by `runner.sh kill` (cancel, down, Ctrl-C) or by a TERM from outside.
        if [ "$code" = 0 ]; then state=succeeded
        elif [ -f "$jobdir/cancelled" ] || [ "$code" = 143 ]; then state=killed
        else state=failed; fi
    elif [ -z "$pid" ]; then
        state=pending
    elif [ "$alive" = 1 ]; then
        state=running
    else
        # The supervisor is gone without writing an exit code: the node rebooted or was killed.
        state=lost
    fi
    size=$(wc -c 2>/dev/null < "$jobdir/log" || echo 0)
    printf '{"state":"%s","pid":%s,"exit_code":%s,"started_at":%s,"ended_at":%s,"log_bytes":%s}\n' \
        "$state" "${pid:-null}" "${code:-null}" "${started:-null}" "${ended:-null}" "$size"
}

write_exit() {
    now > "$jobdir/ended_at"
    echo "$1" > "$jobdir/exit_code.tmp" && mv "$jobdir/exit_code.tmp" "$jobdir/exit_code"
}

case "$mode" in
start)
    [ -f "$jobdir/cmd.sh" ] || { echo "runner: $jobdir/cmd.sh missing" >&2; exit 2; }
    if [ -f "$jobdir/pid" ]; then echo "runner: job in $jobdir was already started" >&2; exit 3; fi
    # setsid gives the job its own session and process group, so neither a closed SSH session
    # nor Ctrl-C in the CLI reaches it; only `runner.sh kill` (or a stopped VM) ends it.
    setsid sh "$0" _supervise "$jobdir" "$grace" "${4:-}" </dev/null >/dev/null 2>&1 &
    i=0
    while [ ! -s "$jobdir/pid" ] && [ $i -lt 1000 ]; do sleep 0.01; i=$((i + 1)); done
    [ -s "$jobdir/pid" ] || { echo "runner: job did not start" >&2; exit 4; }
    cat "$jobdir/pid"
    ;;
_supervise)
    cd "$jobdir" || exit 1
    unset CLOUDTRAIN_ASKED_BY  # the node helper that started us is no business of the job's
    export CLOUDTRAIN_JOB_DIR="$jobdir"
    export CLOUDTRAIN_PROGRESS_FILE="$jobdir/progress"
    # The identity first: whoever sees the pid also finds what makes it this process.
    proc_identity $$ > identity.tmp && mv identity.tmp identity
    echo $$ > pid.tmp && mv pid.tmp pid
    now > started_at
    # started_at's mtime marks where this job's results begin (collect takes only files modified
    # after it). File times move in clock ticks (a few ms): wait one out so that nothing the job
    # writes can share started_at's time. (POSIX sleep takes whole seconds; most take fractions.)
    sleep 0.02 2>/dev/null || sleep 1
    if [ -f cancelled ] || [ -f exit_code ]; then
        # Cancelled while starting: the job never runs.
        [ -f exit_code ] || { now > ended_at; echo 143 > exit_code.tmp && mv exit_code.tmp exit_code; }
        exit 0
    fi
    child=
    deadline=${4:-}
    finish() {
        code=$1
        trap '' TERM INT HUP USR1
        # Killed (runner.sh kill): what is left of the job gets the kill's grace, which `kill` left
        # in kill_grace before its TERM, not only this supervisor's start grace. The child is often
        # a wrapper shell (dash runs a `run:` line's command as a child of `sh cmd.sh`) that dies at
        # once on TERM while the real job still writes its last checkpoint: its death is not the
        # job's end. (Read here, not in the TERM trap: the child may die of the kill's TERM before
        # ours arrives, and then `wait` below returns without the trap.)
        asked=""
        read -r asked < kill_grace 2>/dev/null || true
        case $asked in '' | *[!0-9]*) ;; *) grace=$asked ;; esac
        # Whatever the job left behind (background processes, daemons of its own) ends with it.
        # Done while this supervisor lives, so the session id cannot have been reused.
        end_processes $$ 1
        write_exit "$code"
        exit 0
    }
    # The deadline: a timer in the job's session signals this supervisor, which ends the whole
    # session (the job, what it started, the timer) as `kill` does and records exit code 124.
    on_deadline() {
        trap '' TERM INT HUP USR1
        : > timed_out
        echo "cloudtrain: the job reached its deadline of ${deadline}s and was stopped" >> log
        end_processes $$ 1
        wait "$child" 2>/dev/null
        finish 124
    }
    trap '[ -n "$child" ] && kill -TERM "$child" 2>/dev/null; wait "$child" 2>/dev/null; finish 143' TERM INT HUP
    trap on_deadline USR1
    (
        [ -f env.sh ] && . ./env.sh
        # Setup and run inside the node's venv (bootstrap.sh made it and marked it): `pip install`
        # works on images whose Python refuses it (PEP 668), `python` is the one cloudtrain chose,
        # and preinstalled frameworks stay visible. A venv without the marker (local runs use the
        # CLI's own interpreter) is left alone.
        venv=${CLOUDTRAIN_PYTHON:-}
        venv=${venv%/bin/python}
        if [ -n "$venv" ] && [ -f "$venv/.cloudtrain" ]; then
            VIRTUAL_ENV=$venv
            PATH=$venv/bin:$PATH
            export VIRTUAL_ENV PATH
        fi
        cd "${CLOUDTRAIN_WORKDIR:-.}" || exit 1
        exec sh "$jobdir/cmd.sh"
    ) >> log 2>&1 &
    child=$!
    if [ -n "$deadline" ] && [ "$deadline" -gt 0 ] 2>/dev/null; then
        echo "$deadline" > deadline_s
        sup=$$
        # Signals only a supervisor that is still this job's (alive, leading its own session, no exit code).
        (
            sleep "$deadline"
            [ -f "$jobdir/exit_code" ] && exit 0
            if [ -r "/proc/$sup/stat" ]; then
                stat=""
                read -r stat < "/proc/$sup/stat" 2>/dev/null || exit 0
                rest=${stat##*) }
                set -f
                # shellcheck disable=SC2086
                set -- $rest
                set +f
                [ "${4:-}" = "$sup" ] || exit 0
            fi
            kill -USR1 "$sup" 2>/dev/null
        ) </dev/null >/dev/null 2>&1 &
    fi
    wait "$child"
    finish $?
    ;;
status)
    print_status
    ;;
kill)
    [ -d "$jobdir" ] || exit 0
    [ -f "$jobdir/exit_code" ] || : > "$jobdir/cancelled"
    # The supervisor gives what is left of the job this grace (see finish in _supervise).
    case $grace in '' | *[!0-9]*) ;; *) [ -f "$jobdir/exit_code" ] || echo "$grace" > "$jobdir/kill_grace" ;; esac
    # A start may be under way (Ctrl-C while `start` ran): `cancelled` is written before the pid is
    # read, and the supervisor writes its pid before it looks for `cancelled`, so one of us acts.
    pid=$(cat "$jobdir/pid" 2>/dev/null || true)
    i=0
    while [ -z "$pid" ] && [ -f "$jobdir/cmd.sh" ] && [ $i -lt 20 ]; do
        sleep 0.05
        i=$((i + 1))
        pid=$(cat "$jobdir/pid" 2>/dev/null || true)
    done
    if [ -z "$pid" ]; then
        # Never started, and now it never will: over, not pending forever.
        [ -f "$jobdir/exit_code" ] || write_exit 143
        print_status
        exit 0
    fi
    if [ ! -f "$jobdir/exit_code" ] && supervisor_alive "$pid"; then
        # The supervisor's trap TERMs the job and sweeps the session; we TERM the whole session
        # at once too, so a job whose shell ignores the signal still loses its children.
        find_job_processes "$pid" 1
        signal_found TERM
        i=0
        while [ ! -f "$jobdir/exit_code" ] && [ $i -lt $(((grace + 2) * 10)) ]; do sleep 0.1; i=$((i + 1)); done
    fi
    if [ ! -f "$jobdir/exit_code" ]; then
        # The supervisor hangs on a job that ignores TERM, or it was killed itself.
        if supervisor_alive "$pid"; then find_job_processes "$pid" 1; signal_found KILL; fi
        write_exit 137
    fi
    # How it ended, read now and given in the kill's own answer: once the job is over, whoever
    # follows it may take the node down at once (a local node's directory goes away), so neither a
    # later round trip nor a later read here could find it.
    ended=$(print_status)
    # Leftovers of a supervisor that was killed (-9, OOM) carry the job's mark.
    end_processes "$pid" 0
    printf '%s\n' "$ended"
    ;;
follow)
    off=${3:-0}
    events=${4:-}
    [ -d "$jobdir" ] || { echo "runner: no job in $jobdir" >&2; exit 3; }
    while :; do
        over=0
        if [ -f "$jobdir/exit_code" ]; then
            over=1
        elif [ -s "$jobdir/pid" ] && ! supervisor_alive "$(cat "$jobdir/pid")"; then
            over=1 # the supervisor is gone without an exit code (lost): nothing more will come
        fi
        size=$(wc -c 2>/dev/null < "$jobdir/log" || echo 0)
        if [ "$size" -gt "$off" ]; then
            [ -n "$events" ] && printf 'L %d\n' $((size - off))
            tail -c +$((off + 1)) "$jobdir/log" | head -c $((size - off))
            off=$size
        fi
        if [ -n "$events" ] && [ -f "$jobdir/progress" ]; then
            esize=$(wc -c < "$jobdir/progress")
            if [ "$esize" -gt "$events" ]; then
                printf 'P %d\n' $((esize - events))
                tail -c +$((events + 1)) "$jobdir/progress" | head -c $((esize - events))
                events=$esize
            fi
        fi
        [ "$over" = 1 ] && exit 0
        # Whoever asked is gone (channel closed, CLI killed): stop instead of polling until the job ends.
        # Asked through cloudtrain's node helper (sync_helper.py serve), that is the helper.
        kill -0 "${CLOUDTRAIN_ASKED_BY:-$PPID}" 2>/dev/null || exit 0
        sleep 0.05
    done
    ;;
kill-all)
    [ -d "$jobdir" ] || exit 0
    for d in "$jobdir"/*/; do
        [ -f "$d/pid" ] || continue
        sh "$0" kill "${d%/}" "$grace" >/dev/null
    done
    ;;
*)
    echo "runner: unknown mode $mode" >&2
    exit 2
    ;;
esac
