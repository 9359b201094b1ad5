#!/usr/bin/env bash
# The GPU suite (issue 28): everything mpitensor does on a GPU, in one run of at most 8 minutes.
#
#   bash benchmarks/gpu_suite.sh                 # from anywhere; results under $GPU_SUITE_OUT
#
# Steps, each under its own timeout (the run goes on past a failing one):
#   setup          find or make a Python with numpy, mpi4py (and an MPI), cupy, pytest, pytest-mpi
#   cupy-tests     the in-process tests marked gpu (pytest -m gpu)
#   cupy-mpi-1     the MPI suites that loop over array kinds (NumPy, Tensor, CuPy), 1 rank
#   cupy-mpi-2     the same at 2 ranks (over MPI: NCCL refuses two ranks on one GPU)
#   sharded        DTensor redistribution + one fully_shard step on a cuda mesh, 2 ranks, vs NumPy
#   nccl-allreduce all_reduce 1 MiB .. 1 GiB, mpitensor NCCL vs torch NCCL, one rank per GPU
#   train-compare  LeNet + SGD on the GPU, mpitensor vs torch (same weights, batches), samples/s
#   train.py       examples/train.py --device cuda as a user runs it
# At the end: a summary table (step, status, seconds, key figure) and a markdown block for
# docs/gpu.md (date, commit, machine, figures), also written to $GPU_SUITE_OUT/gpu_md_block.md.
# Without a GPU it says so and exits 0 having run nothing.
#
# Environment:
#   PYTHON              the interpreter to use (default: .venv/bin/python, else python3)
#   GPU_SUITE_OUT       folder for logs and tables (default: a new folder under /tmp)
#   GPU_SUITE_WHEELS    a folder of wheels to install missing packages from, offline
#                       (default: .whl in the checkout); else pip asks the package registry
#   GPU_SUITE_OFFLINE   set: never ask the registry (use the wheels folder alone)
#   GPU_SUITE_BUDGET    seconds for the whole run (default 480)
#   GPU_SUITE_COMMIT    the commit to report where the copy has no .git
#   GPU_SUITE_TRAIN_ARGS  arguments for train.py (default: --dataset digits --epochs 2)
#   NVIDIA_SMI          the nvidia-smi to ask (default: the one on the PATH)
set -u

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
BUDGET=${GPU_SUITE_BUDGET:-480}
SMI=${NVIDIA_SMI:-nvidia-smi}

case "${1:-}" in
  -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}"
             exit 0 ;;
  "") ;;
  *) echo "gpu_suite: unknown argument '$1' (it takes none; see --help)" >&2; exit 2 ;;
esac

# ---------------------------------------------------------------- is there a GPU at all
no_gpu() {
  echo "gpu_suite: no GPU on this machine ($1): nothing GPU-related was run."
  exit 0
}
command -v "$SMI" >/dev/null 2>&1 || no_gpu "'$SMI' is not on the PATH"
if ! GPU_LIST=$("$SMI" -L 2>&1); then
  no_gpu "$SMI -L failed: $(echo "$GPU_LIST" | head -1)"
fi
NGPU=$(printf '%s\n' "$GPU_LIST" | grep -c '^GPU [0-9]')
[ "$NGPU" -ge 1 ] || no_gpu "$SMI -L lists no device: $(echo "$GPU_LIST" | head -1)"

OUTD=${GPU_SUITE_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/gpu_suite.XXXXXX")}
mkdir -p "$OUTD" || exit 2
echo "gpu_suite: $NGPU GPU(s): $(printf '%s\n' "$GPU_LIST" | head -1); logs in $OUTD;" \
     "budget ${BUDGET}s"

NAMES=(); STATUS=(); SECS=(); FIGS=()
record() {  # name status seconds figure
  NAMES+=("$1"); STATUS+=("$2"); SECS+=("$3"); FIGS+=("$4")
  printf '[%s] %s in %ss (%ss elapsed): %s\n' "$1" "$2" "$3" "$SECONDS" "$4"
}

# ---------------------------------------------------------------- setup: the Python environment
MODULES="numpy mpi4py cupy pytest pytest_mpi pytest_timeout ml_dtypes threadpoolctl"
missing_modules() {  # the modules of $MODULES that $1 cannot import
  "$1" - $MODULES <<'EOF' 2>/dev/null || echo "$MODULES"
import importlib, sys
print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))
EOF
}
pip_name() {  # the registry's name for a module
  case "$1" in
    cupy) if "$SMI" 2>/dev/null | grep -q 'CUDA Version: 1[3-9]'; then echo cupy-cuda13x
          else echo cupy-cuda12x; fi ;;
    pytest_mpi|pytest_timeout|ml_dtypes) echo "${1//_/-}" ;; *) echo "$1" ;;
  esac
}
setup_python() {
  PY=""
  for c in "${PYTHON:-}" "$ROOT/.venv/bin/python" python3 python; do
    [ -n "$c" ] && command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys' 2>/dev/null \
      && { PY=$(command -v "$c"); break; }
  done
  [ -n "$PY" ] || { SETUP_NOTE="no Python interpreter found"; return 1; }
  SITE="$OUTD/site"
  export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}" PATH="$SITE/bin:$PATH"
  local miss wheels="${GPU_SUITE_WHEELS:-$ROOT/.whl}"
  miss=$(missing_modules "$PY")
  if [ -n "$miss" ] && compgen -G "$wheels/*.whl" >/dev/null; then
    echo "setup: installing from $wheels for: $miss"
    timeout 120 "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$wheels"/*.whl
    miss=$(missing_modules "$PY")
  fi
  if [ -n "$miss" ] && [ -z "${GPU_SUITE_OFFLINE:-}" ]; then
    local names=""; for m in $miss; do names="$names $(pip_name "$m")"; done
    [ "$miss" != "${miss/mpi4py/}" ] && names="$names mpich"
    echo "setup: asking the package registry for:$names"
    timeout 120 "$PY" -m pip install -q --target "$SITE" $names || true
    miss=$(missing_modules "$PY")
  fi
  local core=${miss/pytest_mpi/}
  if [ -n "${core// /}" ]; then
    SETUP_NOTE="$PY lacks: $miss (pip install$(for m in $miss; do printf ' %s' \
"$(pip_name "$m")"; done), or put their wheels in $wheels)"
    return 1
  fi
  # the compiled agreement check; without it mpitensor uses its pure-Python twin
  ls "$ROOT"/mpitensor/distributed/health/_slots*.so >/dev/null 2>&1 \
    || timeout 60 "$PY" setup.py -q build_ext --inplace >"$OUTD/build_ext.log" 2>&1 || true
  check_mpi || { [ -z "${GPU_SUITE_OFFLINE:-}" ] \
    && timeout 120 "$PY" -m pip install -q --target "$SITE" mpich >/dev/null 2>&1 && check_mpi; }
  [ "$miss" = "${miss/pytest_mpi/}" ] || { MPI_TESTS_WHY="no pytest-mpi (pip install pytest-mpi, \
or its wheel in $wheels)"; SETUP_STATUS=PART; }
  SETUP_NOTE="$("$PY" -c 'import sys, numpy, cupy; print(f"Python {sys.version.split()[0]}, NumPy {numpy.__version__}, CuPy {cupy.__version__}")'); ${MPI_WHY:-$MPI_LIB, ${MPIEXEC:-no mpiexec (2-rank steps skipped)}}${MPI_TESTS_WHY:+; $MPI_TESTS_WHY}"
}
check_mpi() {  # an MPI library under mpi4py (MPI_LIB), and mpiexec where there is one
  MPIEXEC=$(command -v "$(dirname "$PY")/mpiexec" || command -v mpiexec || true)
  if MPI_LIB=$("$PY" -c 'from mpi4py import MPI; print(" ".join(MPI.Get_library_version().split(chr(10))[0].split()))' 2>&1); then
    MPI_WHY=""; return 0
  fi
  MPI_WHY="mpi4py finds no MPI library: $(echo "$MPI_LIB" | tail -1 | cut -c1-100) (pip install mpich)"
  SETUP_STATUS=PART; return 1
}
t=$SECONDS
SETUP_STATUS=PASS MPI_WHY="" MPI_TESTS_WHY=""
if setup_python; then record setup "$SETUP_STATUS" $((SECONDS - t)) "$SETUP_NOTE"; READY=1
else record setup FAIL $((SECONDS - t)) "$SETUP_NOTE"; READY=0; fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} PYTHONUNBUFFERED=1

# ---------------------------------------------------------------- the steps
figure_of() {  # the key figure of a step's log
  local log=$1 fig
  fig=$(grep '^KEY: ' "$log" | tail -1 | cut -c6-)
  [ -n "$fig" ] || fig=$(grep -E '[0-9]+ (passed|failed)|no tests ran' "$log" | tail -1 | tr -d '=' | sed 's/^ *//')
  [ -n "$fig" ] || fig=$(grep 'samples/s' "$log" | tail -1 | sed 's/^ *//')
  [ -n "$fig" ] || fig=$(grep -v '^\s*$' "$log" | tail -1 | cut -c1-120)
  echo "$fig"
}
step() {  # name timeout ranks command...: run it under min(timeout, what the budget has left)
  # ranks 0: a plain process; N: N ranks under mpiexec (one rank runs as a singleton without it)
  local name=$1 limit=$2 n=$3; shift 3
  local left=$((BUDGET - SECONDS - 5)) launch=()
  if [ "$READY" != 1 ]; then record "$name" SKIP 0 "setup failed"; return; fi
  if [ "$left" -lt 10 ]; then record "$name" SKIP 0 "out of the ${BUDGET}s budget"; return; fi
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$n" -gt 0 ] && [ -n "$MPI_WHY" ]; then record "$name" SKIP 0 "$MPI_WHY"; return; fi
  if [ "$name" != "${name#cupy-mpi}" ] && [ -n "$MPI_TESTS_WHY" ]; then
    record "$name" SKIP 0 "$MPI_TESTS_WHY"; return
  fi
  if [ "$n" -gt 0 ] && [ -n "${MPIEXEC:-}" ]; then launch=("$MPIEXEC" -n "$n")
  elif [ "$n" -gt 1 ]; then record "$name" SKIP 0 "no mpiexec to start $n ranks"; return; fi
  local log="$OUTD/$name.log" t=$SECONDS rc st
  echo "[$name] ${launch[*]:+${launch[*]} }$* (timeout ${limit}s)"
  timeout -k 10 "$limit" "${launch[@]}" "$@" >"$log" 2>&1; rc=$?
  case $rc in 0) st=PASS ;; 124|137) st=TIMEOUT ;; *) st="FAIL(rc $rc)" ;; esac
  [ "$st" = PASS ] || tail -n 8 "$log" | sed "s/^/    $name| /"
  local fig; fig=$(figure_of "$log")
  [ "$st" = TIMEOUT ] && fig="stopped after ${limit}s${fig:+; last: $fig}"
  record "$name" "$st" $((SECONDS - t)) "$fig"
}

GPU_TESTS=$(grep -l 'mark\.gpu' tests/test_*.py 2>/dev/null | tr '\n' ' ')
KIND_SUITES=$(grep -l 'arrayimpl' tests/mpi/test_*.py 2>/dev/null | tr '\n' ' ')
PYTEST=(-m pytest -q -p no:cacheprovider --timeout=120)
# no file found must not become "pytest with no paths" (the whole suite)
[ -n "$GPU_TESTS" ] || GPU_TESTS=tests/no-gpu-marked-tests-found
[ -n "$KIND_SUITES" ] || KIND_SUITES=tests/mpi/no-array-kind-suites-found
step cupy-tests 100 0 "${PY:-python3}" "${PYTEST[@]}" -m gpu $GPU_TESTS
step cupy-mpi-1 50 1 "${PY:-python3}" "${PYTEST[@]}" --with-mpi $KIND_SUITES
step cupy-mpi-2 70 2 "${PY:-python3}" "${PYTEST[@]}" --with-mpi $KIND_SUITES
step sharded 45 2 "${PY:-python3}" benchmarks/gpu_sharded_check.py --device cuda
step nccl-allreduce 60 "$NGPU" "${PY:-python3}" benchmarks/gpu_allreduce.py \
  --min-bytes 1M --max-bytes 1G --md "$OUTD/allreduce.md"
step train-compare 60 0 "${PY:-python3}" benchmarks/gpu_train_compare.py --md "$OUTD/train.md"
# shellcheck disable=SC2086 # the arguments are meant to split
step train.py 45 0 "${PY:-python3}" examples/train.py --device cuda --no-plot --no-progress \
  --checkpoint-dir "$OUTD/checkpoints" ${GPU_SUITE_TRAIN_ARGS:---dataset digits --epochs 2}

# ---------------------------------------------------------------- summary and docs block
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "${GPU_SUITE_COMMIT:-unknown (no .git in this copy)}")
[ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null | head -1)" ] \
  && COMMIT="$COMMIT + uncommitted changes"
FAILED=0
{
  echo "### GPU suite, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $COMMIT"
  echo
  echo "Machine: $("$SMI" --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1) x $NGPU;" \
       "${SETUP_NOTE:-}. Command: \`bash benchmarks/gpu_suite.sh\` (${SECONDS}s)."
  echo
  echo "| step | status | seconds | key figure |"
  echo "|---|---|---|---|"
  for i in "${!NAMES[@]}"; do
    echo "| ${NAMES[$i]} | ${STATUS[$i]} | ${SECS[$i]} | ${FIGS[$i]//|//} |"
    case ${STATUS[$i]} in PASS|PART|SKIP) ;; *) FAILED=1 ;; esac
  done
  for part in allreduce:"all_reduce (float32, in place, back to back; one rank per GPU)" \
              train:"LeNet training on the GPU (samples/s, median of 3)"; do
    [ -s "$OUTD/${part%%:*}.md" ] && { echo; echo "${part#*:}:"; echo; cat "$OUTD/${part%%:*}.md"; }
  done
} >"$OUTD/gpu_md_block.md"

echo
echo "gpu_suite summary (${SECONDS}s of ${BUDGET}s):"
printf '  %-15s %-12s %7s  %s\n' step status seconds "key figure"
for i in "${!NAMES[@]}"; do
  printf '  %-15s %-12s %7s  %s\n' "${NAMES[$i]}" "${STATUS[$i]}" "${SECS[$i]}" "${FIGS[$i]}"
done
echo
echo "----- for docs/gpu.md (also in $OUTD/gpu_md_block.md) -----"
cat "$OUTD/gpu_md_block.md"
echo "----- end -----"
exit $FAILED
