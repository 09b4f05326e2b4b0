#!/bin/bash
# Everything the GPU checks need, for the device machine (the `run` tool, carrying .whl):
#   bash tools/device.sh tests [pytest paths…]   GPU tests (-m gpu), JUnit XML under $OUT
#   bash tools/device.sh tune [anybit tune args…] tune into $OUT/cache, copy the table to $OUT/tables
#   bash tools/device.sh bench [anybit bench args…]      bash tools/device.sh eval [anybit eval args…]
#   bash tools/device.sh ncu [tools/ncu_frag.py args…]   Nsight Compute counters of one frag kernel launch
#     (NCU_SCRIPT=tools/moe_bench.py NCU_KERNEL=moe_frag: the grouped kernel, DeepSeek-V3 gate_up first)
#   bash tools/device.sh py tools/X.py [args…]   any script of the repo (e.g. tools/probe_blockwise.py)
#   bash tools/device.sh moe [tools/moe_bench.py args…]   bash tools/device.sh sweep-frag [tools/sweep_frag.py args…]     bash tools/device.sh explain --scheme S --shape M,N,K
# Parts can be chained: bash tools/device.sh tests X -- tune --budget 200
# .whl holds humming-kernels and the pure-Python wheels the image may lack (PyYAML, rich, matplotlib).
# Provenance: start the command with ANYBIT_COMMIT=<hash of this checkout> written out literally —
# `git rev-parse` on the device machine answered a stale commit once (its copy's git metadata lags).
# Kernel compiles: every one is recorded in $OUT/compiles.jsonl; `tools/compile_cache.py` compiles them on the CPU
# machine into .tcache, and a call carrying .tcache loads them instead of compiling (carry [".whl", ".tcache"]).
# Every part's whole output also goes to $OUT/parts.log as it runs (a call cut off by its time limit still brings
# that back; the tails below print only when a part ends).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
log() { tee -a "$OUT/parts.log"; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-}
export ANYBIT_CACHE_DIR=$OUT/cache HUMMING_CACHE_DIR=/tmp/humming-cache
# every kernel compile recorded (tests and probes), for tools/compile_cache.py to compile on the CPU machine into a
# .tcache the next call carries; a carried .tcache is Triton's cache here (its kernels load instead of compiling)
export RECORD_COMPILES=$OUT/compiles.jsonl
[ -d .tcache ] && export TRITON_CACHE_DIR=$PWD/.tcache && echo "Triton cache: .tcache ($(ls .tcache | wc -l) entries)"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
rc=0; nb=0
while [ $# -gt 0 ]; do
  part=$1; shift; args=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do args+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  t0=$(date +%s)
  case $part in
    tests) python3 -m pytest -m gpu -q -p no:cacheprovider --junitxml="$OUT/gpu-tests.xml" "${args[@]}" 2>&1 | log | tail -40 ;;
    tune) python3 tools/recorded.py anybit.cli tune --write-table "$OUT/tables" "${args[@]}" 2>&1 | log | tail -80 ;;
    bench) nb=$((nb + 1)); d=$OUT/bench; [ $nb -gt 1 ] && d=$OUT/bench_$nb  # each bench part its own folder
           python3 tools/recorded.py anybit.cli bench --out "$d" "${args[@]}" 2>&1 | log | tail -120 ;;
    moe) python3 tools/moe_bench.py --out "$OUT" "${args[@]}" 2>&1 | log | tail -150 ;;
    sweep-frag) python3 tools/sweep_frag.py --out "$OUT" "${args[@]}" 2>&1 | log | tail -60 ;;
    explain) python3 -m anybit.cli explain "${args[@]}" 2>&1 | log ;;
    eval) python3 tools/recorded.py anybit.cli eval --out "$OUT/eval" "${args[@]}" 2>&1 | log | tail -80 ;;
    py) OUT=$OUT python3 "${args[@]}" 2>&1 | log | tail -80 ;;
    ncu) tag=$(echo "${args[*]}" | tr -c 'a-zA-Z0-9\n' _); f="$OUT/ncu_$tag.txt"
         ncu --clock-control none --kernel-name "regex:${NCU_KERNEL:-frag}" --launch-skip 2 --launch-count 1 \
           --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
           --section Occupancy --section LaunchStats --section SourceCounters -o "$OUT/ncu_$tag" \
           python3 "${NCU_SCRIPT:-tools/ncu_frag.py}" "${args[@]}" > "$f" 2>&1
         # the summary pages, then the SASS with its warp-stall samples per instruction (for tools/ncu_source.py)
         ncu -i "$OUT/ncu_$tag.ncu-rep" --print-summary none >> "$f" 2>&1
         ncu -i "$OUT/ncu_$tag.ncu-rep" --page source --print-source sass --csv > "$OUT/ncu_${tag}_sass.csv" 2>&1
         tail -90 "$f" ;;
    *) echo "unknown part $part"; exit 2 ;;
  esac
  r=${PIPESTATUS[0]}; [ "$r" -ne 0 ] && rc=$r
  echo "== $part: exit $r, $(( $(date +%s) - t0 )) s"
done
# entries added by this call (a carried .tcache that covered the call's kernels gains only the driver's few modules)
[ -n "${TRITON_CACHE_DIR:-}" ] && echo "Triton cache: $(ls "$TRITON_CACHE_DIR" | wc -l) entries after"
exit $rc
