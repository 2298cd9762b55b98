# cloudtrain's Slurm job: runs on the login node as a runner.sh job (cmd.sh), in the workdir on the
# cluster's shared filesystem. It submits ONE batch job, prints why it waits while it is pending,
# copies the job's output into this job's log as it grows, and exits with the code its end state
# means (cloudtrain/providers/slurm/states.py). TERM, INT or HUP (Ctrl-C of `run`, `cancel`,
# `down`: runner.sh kill) cancel the Slurm job with scancel and wait for it to leave the queue, so no
# allocation outlives its run.
#
# cloudtrain writes above this file (cloudtrain/providers/slurm/batch.py):
#   CT_NAME      the Slurm job name: unique (the cloudtrain job id), so scancel --name finds a job
#                whose id sbatch had no time to print
#   CT_COMMENT   the job's comment, cloudtrain:OWNER:CLUSTER (how `gc` finds our jobs)
#   CT_EXITS     "STATE=CODE ..." for terminal states; "-": the job's own exit code
#   CT_REASONS   "Reason=words" lines for the pending reasons users meet most
#   CT_TASK      what each node runs (templates/slurm_task.sh)
#   CT_SETUP     the recipe's setup ("" for none), run on every node before the job
#   CT_RUN       the job's script
#   "$@"         sbatch options: nodes, partition, account, qos, time, gres, cpus
set -u
jd=${CLOUDTRAIN_JOB_DIR:?runner.sh sets CLOUDTRAIN_JOB_DIR}
out="$jd/slurm.out"
printf '%s' "$CT_TASK" > "$jd/task.sh"
printf '%s' "$CT_RUN" > "$jd/run.sh"
rm -f "$jd/setup.sh" "$jd/slurm_state"
[ -n "$CT_SETUP" ] && printf '%s\n' "$CT_SETUP" > "$jd/setup.sh"
printf '#!/bin/sh\nexec srun --kill-on-bad-exit=1 sh %s/task.sh %s\n' "$jd" "$jd" > "$jd/batch.sh"
: > "$out"
id=""
copied=0

# Print what the job wrote since the last call.
copy_out() {
    size=$(wc -c < "$out" 2>/dev/null || echo 0)
    size=$((size + 0))
    if [ "$size" -gt "$copied" ]; then
        tail -c +"$((copied + 1))" "$out" | head -c "$((size - copied))"
        copied=$size
    fi
}

# Sets $value to field $1 of the `scontrol -o show job` line in $line.
field() {
    value=""
    set -f  # the words are data: no globbing
    for word in $line; do
        case $word in "$1="*) value=${word#*=}; break ;; esac
    done
    set +f
}

queued() { [ -n "$(squeue -h -n "$CT_NAME" -o %i 2>/dev/null)" ]; }

cancel() {
    trap '' TERM INT HUP
    if [ -n "$id" ]; then scancel "$id"; else scancel --name="$CT_NAME"; fi
    # Bounded by runner.sh's grace before KILL (10 s).
    i=0
    while queued && [ $i -lt 70 ]; do sleep 0.1; i=$((i + 1)); done
    copy_out
    if queued; then
        echo "cloudtrain: slurm job ${id:-$CT_NAME} still queued after scancel" >&2
    else
        echo "cloudtrain: slurm job ${id:-$CT_NAME} cancelled"
    fi
    echo "${id:-?} CANCELLED 143" > "$jd/slurm_state"
    exit 143
}
trap cancel TERM INT HUP

id=$(sbatch --parsable --job-name="$CT_NAME" --comment="$CT_COMMENT" --output="$out" --open-mode=append \
    --chdir="$PWD" --ntasks-per-node=1 "$@" "$jd/batch.sh")
code=$?
if [ $code -ne 0 ] || [ -z "$id" ]; then
    echo "cloudtrain: sbatch refused the job (exit $code)" >&2
    exit $((code ? code : 1))
fi
id=${id%%;*}
echo "$id" > "$jd/slurm_id"
echo "cloudtrain: submitted slurm job $id"

said=""
failures=0
while :; do
    if ! line=$(scontrol -o show job "$id" 2>&1); then
        case $line in
            *"Invalid job id"*) state=GONE; break ;;
        esac
        # The controller did not answer: it may be restarting. Give up after a minute.
        failures=$((failures + 1))
        [ $failures -lt 60 ] || { echo "cloudtrain: slurm controller unreachable: $line" >&2; exit 1; }
        sleep 1
        continue
    fi
    failures=0
    field JobState; state=$value
    case " $CT_EXITS " in *" $state="*) break ;; esac
    if [ "$state" = PENDING ]; then
        field Reason
        if [ "$value" != "$said" ]; then
            said=$value
            words=$(printf '%s\n' "$CT_REASONS" | sed -n "s/^$value=//p")
            echo "cloudtrain: slurm job $id pending: $value${words:+ ($words)}"
        fi
    elif [ "$said" != "@running" ]; then
        said="@running"
        field NodeList
        echo "cloudtrain: slurm job $id $(echo "$state" | tr 'A-Z' 'a-z') on $value"
    fi
    copy_out
    sleep 1
done
copy_out
if [ "$state" = GONE ]; then
    echo "cloudtrain: slurm job $id is no longer known to the controller (MinJobAge passed)" >&2
    echo "$id LOST 1" > "$jd/slurm_state"
    exit 1
fi
field ExitCode; slurm_exit=$value
rule=$(for pair in $CT_EXITS; do case $pair in "$state="*) echo "${pair#*=}" ;; esac; done)
if [ "$rule" = "-" ]; then
    code=${slurm_exit%%:*}
    sig=${slurm_exit#*:}
    [ "$code" -gt 0 ] 2>/dev/null || code=$(( ${sig:-0} > 0 ? 128 + sig : 1 ))
else
    code=$rule
fi
# Other nodes' output stays in their own files; a job that did not complete shows their last lines.
if [ "$state" != COMPLETED ]; then
    for log in "$jd"/node-*.log; do
        [ -s "$log" ] || continue
        echo "--- ${log##*/} (last 20 lines)"
        tail -n 20 "$log"
    done
fi
echo "$id $state $code" > "$jd/slurm_state"
echo "cloudtrain: slurm job $id ended $state (exit code $code)"
exit "$code"
