# cloudtrain's task on each node of a Slurm allocation (srun runs one per node):
#   sh task.sh JOBDIR
# Sets the multi-node conventions from Slurm's own variables, the same names every backend sets
# (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, NODE_RANK, NNODES, NPROC_PER_NODE, CLOUDTRAIN_HOSTFILE,
# CLOUDTRAIN_NODE_*; TF_CONFIG for the bundled job), then runs setup and the job in the workdir.
# Node 0's output is the job's log; the others' go to JOBDIR/node-N.log.
set -u
jd=$1
NODE_RANK=${SLURM_NODEID:-0}
NNODES=${SLURM_JOB_NUM_NODES:-1}
gpus=${CT_GPUS_PER_NODE:-0}
NPROC_PER_NODE=$(( gpus > 0 ? gpus : 1 ))
WORLD_SIZE=$((NNODES * NPROC_PER_NODE))
# One port per job (two jobs may share a node), the same on every node.
MASTER_PORT=$((20000 + ${SLURM_JOB_ID:-0} % 20000))
hosts=$(scontrol show hostnames "${SLURM_JOB_NODELIST:-}" 2>/dev/null)
# The address Slurm itself reaches a node at (NodeAddr), else its name.
addresses=""
for host in $hosts; do
    addr=$(scontrol -o show node "$host" 2>/dev/null | tr ' ' '\n' | sed -n 's/^NodeAddr=//p')
    addresses="$addresses ${addr:-$host}"
done
addresses=${addresses# }
MASTER_ADDR=${addresses%% *}
[ -n "$MASTER_ADDR" ] || MASTER_ADDR=127.0.0.1
hostfile="$jd/hostfile"
part="$hostfile.$NODE_RANK"
: > "$part"
for addr in $addresses; do echo "$addr slots=$NPROC_PER_NODE" >> "$part"; done
mv -f "$part" "$hostfile"
export MASTER_ADDR MASTER_PORT WORLD_SIZE NODE_RANK NNODES NPROC_PER_NODE
export CLOUDTRAIN_HOSTFILE="$hostfile"
export CLOUDTRAIN_NODE_RANK=$NODE_RANK CLOUDTRAIN_NUM_NODES=$NNODES
export CLOUDTRAIN_NODE_IPS=$(echo "$addresses" | tr ' ' ',')
if [ "${CT_TF_CONFIG:-0}" = 1 ] && [ "$NNODES" -gt 1 ]; then
    # Each worker its own port: nodes of one host (a test cluster) must not collide.
    workers="" i=0
    for addr in $addresses; do
        workers="$workers${workers:+,}\"$addr:$((MASTER_PORT + 1 + i))\""
        i=$((i + 1))
    done
    export TF_CONFIG="{\"cluster\": {\"worker\": [$workers]}, \"task\": {\"type\": \"worker\", \"index\": $NODE_RANK}}"
fi
cd "${CLOUDTRAIN_WORKDIR:-.}" || exit 1
if [ "$NODE_RANK" != 0 ]; then
    exec > "$jd/node-$NODE_RANK.log" 2>&1
    # The bundled job starts by clearing outputs/ in its working directory, which every node
    # shares here: the other workers write theirs in a directory of their own (rank 0's are the run's).
    if [ "${CT_TF_CONFIG:-0}" = 1 ]; then
        mkdir -p "$jd/node-$NODE_RANK-work" && cd "$jd/node-$NODE_RANK-work" || exit 1
    fi
fi
if [ -f "$jd/setup.sh" ]; then
    sh "$jd/setup.sh" || exit $?
fi
exec sh "$jd/run.sh"
