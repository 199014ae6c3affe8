#!/usr/bin/env bash
# Launch `zhnlp pretrain` under torchrun (torch.distributed.run) on one node or several.
# Run `scripts/pretrain.sh -h` for the options; docs/launch.md has the full guide.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/pretrain.sh [LAUNCH OPTIONS] [--] [ZHNLP PRETRAIN ARGS...]

Start torchrun on this node; every process runs `zhnlp pretrain` with the arguments after the
launch options (the first argument that is not a launch option, or everything after `--`).

launch options (environment variable in brackets):
  --nproc-per-node N     processes on this node [NPROC_PER_NODE]; default: the number of GPUs
                         (CUDA_VISIBLE_DEVICES, else nvidia-smi), or 2 CPU processes without GPUs
  --nnodes N|MIN:MAX     number of nodes [NNODES] (default 1); MIN:MAX for an elastic job
  --node-rank R          this node's rank, 0..N-1 [NODE_RANK] (default 0); used with
                         --master-addr only: c10d rendezvous numbers the nodes itself
  --rdzv-endpoint H:P    c10d rendezvous on HOST:PORT [RDZV_ENDPOINT]; the same on every node
                         (the host is usually the first node); needed when --nnodes > 1
  --rdzv-id ID           job id shared by the nodes of one job [RDZV_ID] (default: $SLURM_JOB_ID
                         when set, else zhnlp-pretrain)
  --rdzv-conf K=V,...    c10d rendezvous settings [RDZV_CONF], e.g. last_call_timeout=5 (seconds an
                         elastic job waits for more nodes once MIN have joined; torch's default 30)
  --master-addr HOST     static rendezvous instead of c10d (for launchers that assign node ranks,
  --master-port PORT       e.g. Kubeflow PyTorchJob): needs --node-rank on every node
  --max-restarts N       restart the workers up to N times after a failure [MAX_RESTARTS] (default 0)
  --python PATH          interpreter [PYTHON]; default: the repository's .venv/bin/python when
                         present, else python
  --dry-run              print the command and exit without running it
  -h, --help             show this help and exit

OMP_NUM_THREADS defaults to the CPU cores divided by --nproc-per-node (at least 1).

examples:
  scripts/pretrain.sh -- --recipe ernie-debug --steps 20 --tp 2              # one node
  scripts/pretrain.sh -- --recipe ernie4.5-tiny                              # ERNIE 4.5 decoder, causal LM
  scripts/pretrain.sh -- --recipe ernie4.5-tiny --parallel auto              # the planner picks the layout
  scripts/pretrain.sh --nproc-per-node 8 -- --recipe ernie4.5-0.3b --data /shared/corpus/pd-causal \
      --distributed-optimizer --precision bf16 --output /shared/runs/0.3b  # (zhnlp preprocess --objective causal-lm)
  scripts/pretrain.sh --nnodes 2 --rdzv-endpoint node0:29500 --rdzv-id run1 --max-restarts 3 \
      -- --recipe ernie-3.0-base --data /shared/corpus/pd --output /shared/runs/base  # each node
  scripts/pretrain.sh --nnodes 2:4 --rdzv-endpoint node0:29500 --rdzv-id run2 --max-restarts 3 \
      -- --recipe ernie-3.0-base --distributed-optimizer --save-interval 200 --resume ...
      # elastic: continues on the nodes left (2 to 4) from the last checkpoint, optimizer state included
USAGE
}

die() { echo "pretrain.sh: $*" >&2; exit 2; }

need_value() { [[ $# -ge 2 && -n $2 ]] || die "$1 needs a value (see -h)"; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

nproc=${NPROC_PER_NODE:-}
nnodes=${NNODES:-1}
node_rank=${NODE_RANK:-0}
rdzv_endpoint=${RDZV_ENDPOINT:-}
rdzv_id=${RDZV_ID:-${SLURM_JOB_ID:-zhnlp-pretrain}}
rdzv_conf=${RDZV_CONF:-}
master_addr=""
master_port=""
max_restarts=${MAX_RESTARTS:-0}
python=${PYTHON:-}
dry_run=0

while [[ $# -gt 0 ]]; do
    case $1 in
        -h|--help) usage; exit 0 ;;
        --nproc-per-node) need_value "$@"; nproc=$2; shift 2 ;;
        --nnodes) need_value "$@"; nnodes=$2; shift 2 ;;
        --node-rank) need_value "$@"; node_rank=$2; shift 2 ;;
        --rdzv-endpoint) need_value "$@"; rdzv_endpoint=$2; shift 2 ;;
        --rdzv-id) need_value "$@"; rdzv_id=$2; shift 2 ;;
        --rdzv-conf) need_value "$@"; rdzv_conf=$2; shift 2 ;;
        --master-addr) need_value "$@"; master_addr=$2; shift 2 ;;
        --master-port) need_value "$@"; master_port=$2; shift 2 ;;
        --max-restarts) need_value "$@"; max_restarts=$2; shift 2 ;;
        --python) need_value "$@"; python=$2; shift 2 ;;
        --dry-run) dry_run=1; shift ;;
        --) shift; break ;;
        *) break ;;  # the first argument for `zhnlp pretrain`
    esac
done

# ---------------------------------------------------------------- processes per node
if [[ -z $nproc ]]; then
    if [[ -n ${CUDA_VISIBLE_DEVICES:-} && ${CUDA_VISIBLE_DEVICES} != "-1" ]]; then
        IFS=, read -ra visible <<<"$CUDA_VISIBLE_DEVICES"
        nproc=${#visible[@]}
    elif command -v nvidia-smi >/dev/null 2>&1 && gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU') \
            && [[ $gpus -gt 0 ]]; then
        nproc=$gpus
    else
        nproc=2  # no GPU: CPU processes (gloo)
    fi
fi

[[ $nproc =~ ^[1-9][0-9]*$ ]] || die "--nproc-per-node must be a positive integer, got '$nproc'"
[[ $nnodes =~ ^[1-9][0-9]*(:[1-9][0-9]*)?$ ]] || die "--nnodes must be N or MIN:MAX, got '$nnodes'"
[[ $node_rank =~ ^[0-9]+$ ]] || die "--node-rank must be a non-negative integer, got '$node_rank'"
[[ $max_restarts =~ ^[0-9]+$ ]] || die "--max-restarts must be a non-negative integer, got '$max_restarts'"
max_nodes=${nnodes#*:}
[[ $node_rank -lt $max_nodes ]] || die "--node-rank $node_rank is not below --nnodes $max_nodes"

# ---------------------------------------------------------------- threads per process
if [[ -z ${OMP_NUM_THREADS:-} ]]; then
    cores=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
    threads=$((cores / nproc))
    export OMP_NUM_THREADS=$((threads > 0 ? threads : 1))
fi

# ---------------------------------------------------------------- interpreter
if [[ -z $python ]]; then
    if [[ -x $repo/.venv/bin/python ]]; then
        python=$repo/.venv/bin/python
    else
        python=python
    fi
fi

# ---------------------------------------------------------------- rendezvous
launch=("$python" -m torch.distributed.run --nproc-per-node="$nproc" --nnodes="$nnodes"
        --max-restarts="$max_restarts")
if [[ -n $rdzv_endpoint ]]; then
    [[ -z $master_addr ]] || die "pass either --rdzv-endpoint (c10d) or --master-addr (static), not both"
    [[ $rdzv_endpoint == *:* ]] || die "--rdzv-endpoint must be HOST:PORT, got '$rdzv_endpoint'"
    launch+=(--rdzv-backend=c10d --rdzv-endpoint="$rdzv_endpoint" --rdzv-id="$rdzv_id")
    [[ -z $rdzv_conf ]] || launch+=(--rdzv-conf="$rdzv_conf")
elif [[ -n $rdzv_conf ]]; then
    die "--rdzv-conf is for the c10d rendezvous: pass --rdzv-endpoint HOST:PORT too"
elif [[ -n $master_addr ]]; then
    [[ $nnodes != *:* ]] || die "an elastic --nnodes $nnodes needs --rdzv-endpoint (c10d), not --master-addr"
    launch+=(--node-rank="$node_rank" --master-addr="$master_addr" --master-port="${master_port:-29500}")
elif [[ $nnodes == 1 ]]; then
    launch+=(--standalone)  # a private rendezvous on a free local port
else
    die "--nnodes $nnodes needs --rdzv-endpoint HOST:PORT (or --master-addr with --node-rank)"
fi

cmd=("${launch[@]}" -m zhnlp pretrain "$@")
echo "[pretrain.sh] node rank $node_rank of $nnodes, $nproc processes, OMP_NUM_THREADS=$OMP_NUM_THREADS"
echo "[pretrain.sh] $(printf '%q ' "${cmd[@]}")"
[[ $dry_run == 0 ]] || exit 0
exec "${cmd[@]}"
