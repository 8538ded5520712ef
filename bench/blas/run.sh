#!/usr/bin/env bash
# Build gemm_bench and compare OpenBLAS, BLIS and oneDNN (Debian's OpenMP/libgomp builds)
# at loom's training GEMM shapes; writes bench/blas/results.json and prints markdown tables.
#
#   bench/blas/run.sh                  # everything, ~4.5 min on an idle 2-core machine
#   MIN_TIME=0.5 bench/blas/run.sh     # longer timing per shape and library
#   INVESTIGATE=1 bench/blas/run.sh    # + oversubscription / OMP_WAIT_POLICY experiment
#   DEADLINE=600                       # max seconds per config to wait for a quiet machine
#   KEEP_RAW=1 STAGES="avx2" bench/blas/run.sh
#                                      # keep earlier runs' raw results (build/raw) and add
#                                      # to them; per shape the quietest measurement wins
#
# Stages (config names as in results.json):
#   auto      : one binary LINKED against each library (the way loom will link it), no ISA
#               override; square + one mid shape -> records what each library auto-detects
#   avx2      : all shapes, 2 threads, every library forced to its AVX2+FMA kernels
#               (loom's target ISA); runtime-selected (dlopen) binary, interleaved timing
#   avx2_1t   : 2048^3 with 1 thread (threading-scaling check)
#   avx512    : only if the CPU has avx512f: all shapes with AVX-512 kernels
#   avx512_1t
# Do not run other heavy work while this runs. gemm_bench waits for a quiet machine before
# each shape and re-measures shapes during which other processes used > 5% of the CPUs
# (until DEADLINE); the quietest measurement is kept and the tables show its "other load".
# On a quiet machine the whole script takes ~4.5 min.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$here/build"
raw="$build/raw"
mkdir -p "$build"
[[ "${KEEP_RAW:-0}" == 1 ]] || rm -rf "$raw"
mkdir -p "$raw"
run_id="$(date -u +%Y%m%dT%H%M%S)"
STAGES="${STAGES-auto avx2 avx512}"

MIN_TIME="${MIN_TIME:-0.3}"
THREADS="${THREADS:-2}"
DEADLINE="${DEADLINE:-600}"
ARCH_LIB=/usr/lib/x86_64-linux-gnu
ARCH_INC=/usr/include/x86_64-linux-gnu
CXXFLAGS=(-O3 -march=native -fopenmp -std=c++20 -Wall -Wextra)

echo "== building (g++ ${CXXFLAGS[*]})"
src="$here/gemm_bench.cpp"
g++ "${CXXFLAGS[@]}" "$src" -o "$build/gemm_bench" -ldl
g++ "${CXXFLAGS[@]}" -DLOOM_BLAS_LINKED_OPENBLAS -isystem "$ARCH_INC/openblas-openmp" "$src" \
    -o "$build/gemm_openblas" -L"$ARCH_LIB/openblas-openmp" -Wl,-rpath,"$ARCH_LIB/openblas-openmp" -lopenblas -ldl
g++ "${CXXFLAGS[@]}" -DLOOM_BLAS_LINKED_BLIS -isystem "$ARCH_INC/blis-openmp" "$src" \
    -o "$build/gemm_blis" -L"$ARCH_LIB/blis-openmp" -Wl,-rpath,"$ARCH_LIB/blis-openmp" -lblis -ldl
g++ "${CXXFLAGS[@]}" -DLOOM_BLAS_LINKED_DNNL "$src" -o "$build/gemm_onednn" -ldnnl -ldl

echo "== OpenMP runtime of each library (ldd)"
for so in "$ARCH_LIB/openblas-openmp/libopenblas.so.0" "$ARCH_LIB/blis-openmp/libblis.so.4" "$ARCH_LIB/libdnnl.so.2"; do
    echo "-- $so -> $(readlink -f "$so")"
    ldd "$so" | grep -E 'omp|tbb|pthread' || true
done

model="$(lscpu | sed -n 's/^Model name:[[:space:]]*//p')"
has_avx512=0
grep -qw avx512f /proc/cpuinfo && has_avx512=1
python3 - "$build/machine.json" "$model" "$has_avx512" "${CXXFLAGS[*]}" <<'EOF'
import json, os, subprocess, sys, datetime
out, model, avx512, flags_cc = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4]
flags = open("/proc/cpuinfo").read().split("\nflags")[1].split("\n")[0].split()
ldd = {}
for so in ("openblas-openmp/libopenblas.so.0", "blis-openmp/libblis.so.4", "libdnnl.so.2"):
    t = subprocess.run(["ldd", "/usr/lib/x86_64-linux-gnu/" + so], capture_output=True, text=True).stdout
    ldd[so] = [l.strip() for l in t.splitlines() if "omp" in l or "tbb" in l]
json.dump({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "lscpu_model": model, "nproc": os.cpu_count(),
           "avx2": "avx2" in flags, "fma": "fma" in flags, "avx512f": avx512,
           "compiler": subprocess.run(["g++", "--version"], capture_output=True, text=True).stdout.splitlines()[0],
           "cxxflags": flags_cc, "openmp_runtime_ldd": ldd}, open(out, "w"), indent=1)
EOF
echo "CPU: $model  nproc=$(nproc)  avx512f=$has_avx512  loadavg: $(cut -d' ' -f1-3 /proc/loadavg)"

# Every BLAS/OpenMP knob is unset, then thread counts are set for OpenMP and for each
# library's own setting (the program also calls openblas_set_num_threads /
# bli_thread_set_num_threads; oneDNN follows omp_get_max_threads()).
clean_env() {
    local nt="$1"
    shift
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE -u OPENBLAS_NUM_THREADS -u GOTO_NUM_THREADS \
        -u BLIS_ARCH_TYPE -u BLIS_NUM_THREADS -u ONEDNN_MAX_CPU_ISA -u DNNL_MAX_CPU_ISA \
        -u OMP_WAIT_POLICY -u OMP_PROC_BIND -u OMP_PLACES -u GOMP_SPINCOUNT -u OMP_DYNAMIC \
        OMP_NUM_THREADS="$nt" OPENBLAS_NUM_THREADS="$nt" BLIS_NUM_THREADS="$nt" "$@"
}
nrun=0
# bench CONFIG BINARY THREADS FILTER [VAR=VALUE...] [--extra-args...]
bench() {
    local cfg="$1" bin="$2" nt="$3" filter="$4"
    shift 4
    nrun=$((nrun + 1))
    local envs=() extra=()
    for a in "$@"; do
        if [[ "$a" == --* || ${#extra[@]} -gt 0 ]]; then extra+=("$a"); else envs+=("$a"); fi
    done
    local json="$raw/$run_id-$(printf %02d "$nrun")-$cfg-${bin#gemm_}.json"
    local args=(--config "$cfg" --min-time "$MIN_TIME" --threads "$nt" --json "$json")
    [[ -n "$filter" ]] && args+=(--filter "$filter")
    echo
    echo "== config=$cfg binary=$bin threads=$nt ${filter:+filter=$filter} ${envs[*]-}"
    clean_env "$nt" ${envs[@]+"${envs[@]}"} "$build/$bin" "${args[@]}" ${extra[@]+"${extra[@]}"}
}
# BLIS_ARCH_TYPE is the numeric arch_t id of BLIS 0.9.0: 0=skx 3=haswell 24=generic.
AVX2_ENV=(OPENBLAS_CORETYPE=Haswell BLIS_ARCH_TYPE=3 ONEDNN_MAX_CPU_ISA=AVX2)
# AVX-512: OpenBLAS and oneDNN auto-detect; BLIS 0.9.0 does not know this CPU family and
# falls back to "generic" kernels, so it is forced to its skx (AVX-512) kernels.
AVX512_ENV=(BLIS_ARCH_TYPE=0)

if [[ " $STAGES " == *" auto "* ]]; then
    for lib in openblas blis onednn; do
        bench auto "gemm_$lib" "$THREADS" "6L-384/mlp_fc/NN" --deadline 120
        bench auto "gemm_$lib" "$THREADS" "square/2048^3/" --deadline 120
    done
fi
if [[ " $STAGES " == *" avx2 "* ]]; then
    bench avx2 gemm_bench "$THREADS" "" "${AVX2_ENV[@]}" --deadline "$DEADLINE"
    bench avx2_1t gemm_bench 1 "square/2048^3/" "${AVX2_ENV[@]}" --deadline 120
fi
if [[ " $STAGES " == *" avx512 "* && "$has_avx512" == 1 ]]; then
    bench avx512 gemm_bench "$THREADS" "" "${AVX512_ENV[@]}" --deadline "$DEADLINE"
    bench avx512_1t gemm_bench 1 "square/2048^3/" "${AVX512_ENV[@]}" --deadline 120
fi

if [[ "${INVESTIGATE:-0}" == 1 ]]; then
    # Oversubscription: a busy-loop process competes for one of the cores while the GEMMs
    # run (a small and a large shape, AVX2 kernels). Not part of results.json.
    inv=(--only "nanogpt-char/mlp_fc/NN,6L-384/mlp_fc/NN" --min-time 0.3 --deadline -1)
    for setting in "2 -" "2 active" "2 passive" "1 -"; do
        read -r nt policy <<<"$setting"
        # start the busy loop only on an otherwise quiet machine (others' work is not ours to slow)
        python3 - <<'EOF'
import time
def busy():
    v = list(map(int, open("/proc/stat").readline().split()[1:9]))
    return v[0] + v[1] + v[2] + v[5] + v[6] + v[7], sum(v)
while True:
    b0, t0 = busy(); time.sleep(1.0); b1, t1 = busy()
    if (b1 - b0) <= 0.05 * (t1 - t0):
        break
EOF
        sh -c 'while :; do :; done' &
        hog=$!
        echo
        echo "== investigate: threads=$nt OMP_WAIT_POLICY=$policy, with a busy-loop process (pid $hog)"
        if [[ "$policy" == - ]]; then pol=(); else pol=(OMP_WAIT_POLICY="$policy"); fi
        clean_env "$nt" "${AVX2_ENV[@]}" ${pol[@]+"${pol[@]}"} "$build/gemm_bench" --threads "$nt" "${inv[@]}" \
            | grep -v '^#'
        kill "$hog"
        wait "$hog" 2>/dev/null || true
    done
fi

echo
echo "== summary (markdown)"
python3 "$here/report.py" "$here/results.json" "$build/machine.json" "$raw"/*.json | tee "$build/report.md"
echo
echo "wrote $here/results.json and $build/report.md"
