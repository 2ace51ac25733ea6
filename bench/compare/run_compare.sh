#!/usr/bin/env bash
# run_compare.sh: gflow's allreduce_bw, Gloo and Open MPI side by side, in one
# run, on this host. Every library runs the same sweep (bench/common: same
# sizes, iterations, check and columns); the script only launches them and
# joins their CSV into markdown tables of bus bandwidth and time per size.
#
#   bench/compare/run_compare.sh [-B build-dir] [-n "2 4"] [-b 4K] [-e 64M]
#                                [-i iters] [-w warmup] [-m ip|oop] [-o out.md]
#
# Every flag has an environment equivalent (defaults in brackets):
#   BUILD_DIR    build tree with tools/gflowrun and bench/ [build]
#   NPS          world sizes ["2 4"]
#   MINB, MAXB   smallest and largest message [4K, 64M]
#   ITERS, WARMUP  timed and warm-up iterations per size [20, 5]
#   MODE         ip (in-place, what DDP/Horovod do with gradients) or oop [ip]
#   OUT          markdown file written besides stdout [$BUILD_DIR/compare.md]
#   GFLOW_ALGOS  gflow -a values; "auto" = gflow's own choice ["auto"]
#   GLOO_ALGOS   Gloo algorithms ["ring ring_chunked halving_doubling bcube"]
#   MPI_BTLS     Open MPI transports: tcp (loopback TCP), vader (shared memory) ["tcp vader"]
#   RUN_TIMEOUT  seconds one run may take before it is killed [900]
# Runs that fail (or a library that was not built) show as "-" and are named
# under the tables; the raw CSV and logs stay in the work directory printed at
# the end.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

BUILD_DIR=${BUILD_DIR:-$repo/build}
NPS=${NPS:-"2 4"}
MINB=${MINB:-4K}
MAXB=${MAXB:-64M}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
MODE=${MODE:-ip}
OUT=${OUT:-}
GFLOW_ALGOS=${GFLOW_ALGOS:-auto}
GLOO_ALGOS=${GLOO_ALGOS:-"ring ring_chunked halving_doubling bcube"}
MPI_BTLS=${MPI_BTLS:-"tcp vader"}
RUN_TIMEOUT=${RUN_TIMEOUT:-900}

usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while getopts "B:n:b:e:i:w:m:o:h" opt; do
  case $opt in
    B) BUILD_DIR=$OPTARG ;;
    n) NPS=$OPTARG ;;
    b) MINB=$OPTARG ;;
    e) MAXB=$OPTARG ;;
    i) ITERS=$OPTARG ;;
    w) WARMUP=$OPTARG ;;
    m) MODE=$OPTARG ;;
    o) OUT=$OPTARG ;;
    h) usage 0 ;;
    *) usage 2 >&2 ;;
  esac
done
case $MODE in ip | oop) ;; *) echo "run_compare.sh: -m must be ip or oop" >&2; exit 2 ;; esac
OUT=${OUT:-$BUILD_DIR/compare.md}

gflowrun=$BUILD_DIR/tools/gflowrun
gflow_bw=$BUILD_DIR/bench/allreduce_bw
gloo_bw=$BUILD_DIR/bench/compare/gloo_allreduce_bw
mpi_bw=$BUILD_DIR/bench/compare/mpi_allreduce_bw
if [[ ! -x $gflowrun || ! -x $gflow_bw ]]; then
  echo "run_compare.sh: build gflowrun and allreduce_bw in $BUILD_DIR first (or pass -B)" >&2
  exit 2
fi

work=$(mktemp -d /tmp/gflow-compare.XXXXXX)
sweep=(-b "$MINB" -e "$MAXB" -n "$ITERS" -w "$WARMUP" -d float32 -o sum -c 1 --csv)
failed=()

# run LABEL CSV CMD...: one sweep; its CSV (stdout) goes to CSV, stderr to a log.
run() {
  local label=$1 csv=$2
  shift 2
  echo "== $label: $*" >&2
  if ! timeout --kill-after=10 "$RUN_TIMEOUT" "$@" >"$csv" 2>"${csv%.csv}.log"; then
    echo "   failed (log: ${csv%.csv}.log)" >&2
    tail -n 5 "${csv%.csv}.log" >&2
    failed+=("$label")
    : >"$csv"
  fi
}

mpirun_common=(mpirun --allow-run-as-root --oversubscribe --mca pml ob1)

for np in $NPS; do
  labels=()
  files=()
  for algo in $GFLOW_ALGOS; do
    f=$work/n$np-gflow-$algo.csv
    a=()
    [[ $algo != auto ]] && a=(-a "$algo")
    run "gflow $algo n=$np" "$f" "$gflowrun" -n "$np" --no-prefix -- "$gflow_bw" "${sweep[@]}" "${a[@]}"
    labels+=("gflow $algo")
    files+=("$f")
  done
  for algo in $GLOO_ALGOS; do
    f=$work/n$np-gloo-$algo.csv
    if [[ -x $gloo_bw ]]; then
      run "gloo $algo n=$np" "$f" "$gflowrun" -n "$np" --no-prefix -- "$gloo_bw" "${sweep[@]}" -a "$algo"
    else
      : >"$f"
      failed+=("gloo $algo n=$np (not built)")
    fi
    labels+=("gloo $algo")
    files+=("$f")
  done
  for btl in $MPI_BTLS; do
    f=$work/n$np-mpi-$btl.csv
    if [[ -x $mpi_bw ]] && command -v mpirun >/dev/null; then
      case $btl in
        tcp) mca=(--mca btl "tcp,self" --mca btl_tcp_if_include lo) ;;
        vader) mca=(--mca btl "vader,self") ;;
        *) mca=(--mca btl "$btl,self") ;;
      esac
      run "mpi $btl n=$np" "$f" "${mpirun_common[@]}" "${mca[@]}" -np "$np" "$mpi_bw" "${sweep[@]}"
    else
      : >"$f"
      failed+=("mpi $btl n=$np (not built)")
    fi
    labels+=("mpi $btl")
    files+=("$f")
  done
  printf '%s\n' "${labels[@]}" >"$work/n$np.labels"
  printf '%s\n' "${files[@]}" >"$work/n$np.files"
done

# table NP METRIC: a markdown table, one row per size, one column per run.
# METRIC is busbw or time. Columns of the CSV (bench/common/report.cc):
# 4 size, 8..11 out-of-place time/algbw/busbw/wrong, 12..15 the same in-place.
table() {
  local np=$1 metric=$2
  local col wcol=11
  if [[ $MODE == ip ]]; then
    wcol=15
    col=$([[ $metric == busbw ]] && echo 14 || echo 12)
  else
    col=$([[ $metric == busbw ]] && echo 10 || echo 8)
  fi
  mapfile -t labels <"$work/n$np.labels"
  mapfile -t files <"$work/n$np.files"
  awk -F, -v col="$col" -v wcol="$wcol" -v metric="$metric" \
      -v labels="$(IFS='|'; echo "${labels[*]}")" -v paths="$(IFS='|'; echo "${files[*]}")" '
    BEGIN {
      n = split(labels, name, "|")
      split(paths, path, "|")
      # By name, not by order: an empty file (a failed run) yields no records.
      for (i = 1; i <= n; i++) column[path[i]] = i
    }
    $1 == "library" || $1 == "" { next }  # the CSV header
    {
      k = column[FILENAME]
      size = $4 + 0; sizes[size] = 1
      v[k, size] = $col; w[k, size] = $wcol
    }
    function fmt(x) { return metric == "busbw" ? sprintf("%.3f", x) : sprintf("%.1f", x) }
    function better(a, b) { return metric == "busbw" ? a > b : a < b }
    # > 1 when gflow is faster, for either metric
    function ratio(g, p) {
      if (g == "" || p == "" || g <= 0 || p <= 0) return "-"
      return sprintf("%.2fx", metric == "busbw" ? g / p : p / g)
    }
    function human(s) {
      if (s >= 1048576 && s % 1048576 == 0) return s / 1048576 "M"
      if (s >= 1024 && s % 1024 == 0) return s / 1024 "K"
      return s
    }
    END {
      hdr = "| size |"; sep = "|---:|"
      for (i = 1; i <= n; i++) { hdr = hdr " " name[i] " |"; sep = sep "---:|" }
      hdr = hdr " gflow / best TCP peer | gflow / best peer |"; sep = sep "---:|---:|"
      print hdr; print sep
      m = 0; for (s in sizes) list[++m] = s + 0
      for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (list[j] < list[i]) { t = list[i]; list[i] = list[j]; list[j] = t }
      for (r = 1; r <= m; r++) {
        s = list[r]; line = "| " human(s) " |"
        best_g = ""; best_p = ""; best_t = ""
        for (i = 1; i <= n; i++) {
          if ((i, s) in v && v[i, s] != "") {
            x = v[i, s] + 0
            cell = fmt(x) (w[i, s] != "0" && w[i, s] != "" ? " (wrong " w[i, s] ")" : "")
            if (name[i] ~ /^gflow/) { if (best_g == "" || better(x, best_g)) best_g = x }
            else {
              if (best_p == "" || better(x, best_p)) best_p = x
              # peers over TCP, like gflow today; shared-memory MPI (vader) is not
              if (name[i] !~ /vader/ && (best_t == "" || better(x, best_t))) best_t = x
            }
          } else cell = "-"
          line = line " " cell " |"
        }
        print line " " ratio(best_g, best_t) " | " ratio(best_g, best_p) " |"
      }
    }' "${files[@]}"
}

{
  echo "# gflow vs Gloo vs Open MPI: allreduce, float32 sum"
  echo
  echo "- host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ //'), Linux $(uname -r), load average $(cut -d' ' -f1-3 /proc/loadavg) at the end"
  echo "- gflow $(git -C "$repo" describe --always --dirty 2>/dev/null || echo '(no git)'); $(mpirun --version 2>/dev/null | head -1 || echo 'no mpirun')"
  echo "- sizes $MINB..$MAXB, iters $ITERS, warmup $WARMUP, $([[ $MODE == ip ]] && echo in-place || echo out-of-place); time = max over ranks of the mean per iteration"
  echo "- busbw = algbw x 2(n-1)/n (nccl-tests); a 'gflow / best ...' ratio > 1 means gflow is faster"
  echo "  ('TCP peer': Gloo and mpi tcp, which move data over sockets as gflow's tcp transport does)"
  if [ "${GFLOW_SHM:-1}" = 0 ]; then gpath="TCP on loopback (GFLOW_SHM=0)"; else gpath="shared memory (set GFLOW_SHM=0 for its TCP transport)"; fi
  echo "- gflow runs under gflowrun over $gpath; Gloo under gflowrun, TCP on loopback; mpi tcp = --mca btl tcp,self on lo, mpi vader = shared memory"
  for np in $NPS; do
    echo
    echo "## $np ranks: bus bandwidth (GB/s)"
    echo
    table "$np" busbw
    echo
    echo "## $np ranks: time per allreduce (us)"
    echo
    table "$np" time
  done
  if ((${#failed[@]})); then
    echo
    echo "Runs that produced no numbers: ${failed[*]}"
  fi
} | tee "$OUT"

echo "(tables written to $OUT; raw CSV and logs in $work)" >&2
