#!/usr/bin/env bash
# Forward schedule / tile ablation for bf16 d=128 (needs a -DFLASH3_ABLATION=ON build).
# usage: bench/ablation.sh OUTDIR [BUILD_DIR]   -> OUTDIR/ablation.log
set -uo pipefail
OUT=${1:?outdir}; BUILD=${2:-build}
cd "$(dirname "$0")/.."
log="$OUT/ablation.log"; : > "$log"
run() {  # name schedule causal seqlens
  echo "== $1 (FLASH3_FWD_SCHEDULE=$2, causal=$3)" | tee -a "$log"
  FLASH3_FWD_SCHEDULE=$2 python3 bench/bench.py --lib "$BUILD/libflash3.so" --hdims 128 --passes fwd \
    --causal "$3" --seqlens "$4" --iters 20 --no-check 2>&1 | grep -E "^\| 128" | tee -a "$log"
}
run "default"                 0 both 2k,8k,16k
run "no pingpong"             1 both 2k,8k,16k
run "no intra-wg overlap"     2 both 2k,8k,16k
run "neither"                 3 both 2k,8k,16k
for t in 4:128 5:144 6:160 7:192; do run "tile_n ${t#*:} (non-causal)" "${t%%:*}" off 2k,8k,16k; done
