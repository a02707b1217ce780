#!/usr/bin/env bash
# Profiles one flash3 kernel launch with Nsight Compute (clocks not locked) and
# dumps the SASS facts the performance notes quote (HGMMA count, local-memory
# spills) for the same kernel.
#
# usage: bench/ncu_probe.sh OUTDIR KERNEL_REGEX [bench.py args...]
#   e.g. bench/ncu_probe.sh out flash_bwd_kernel --passes bwd --hdims 128 --seqlens 8k --causal off
set -u
OUT=$1; KREGEX=$2; shift 2
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
LIB=${LIB:-build/libflash3.so}
ncu --clock-control none --kernel-name "regex:${KREGEX}" --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats --section Occupancy \
    --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum \
    python bench/bench.py --lib "$LIB" --iters 1 --warmup 0 --no-check "$@" > "$OUT/ncu_${KREGEX}.txt" 2>&1
echo "ncu rc=$?"
cuobjdump --dump-sass "$LIB" 2>/dev/null | awk -v k="$KREGEX" '
  /Function : / { name = $3; keep = (name ~ k) }
  keep && /HGMMA/ { h[name]++ }
  keep && /STL|LDL/ { s[name]++ }
  keep { seen[name] = 1 }
  END { for (n in seen) printf "%s HGMMA=%d local_mem_instrs=%d\n", n, h[n], s[n] }' > "$OUT/sass_${KREGEX}.txt"
echo "sass functions: $(wc -l < "$OUT/sass_${KREGEX}.txt")"
