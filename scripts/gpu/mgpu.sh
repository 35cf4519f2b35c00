# The "mgpu" mode of scripts/gpu/run.sh (issue 16), sourced by it: collectives and data-parallel
# scaling on every count of visible GPUs in 1 2 4 8, one process per GPU (rank = device).
#   1. benches/collective_bandwidth.c per n, twice: NCCL_LOCAL_REGISTER=1 (gkrt's pool and the
#      plain buffers registered with the communicator) and =0 (NCCL ignores the registrations).
#   2. benches/ddp_compare.py: PyTorch DDP (default buckets) on the network below, per n: median
#      step, the ranks' weights' largest difference, and its peak memory (max over ranks of
#      torch.cuda.max_memory_allocated / reserved).
#   3. examples_c/data_parallel/ on the same network, MGPU_PER_RANK rows per rank: MGPU_STEPS
#      timed steps (rank 0's median; scaling efficiency = throughput / (n x the one-GPU
#      throughput)), then MGPU_TRACE_STEPS traced ones (each rank's trace in dp_nN_trace/, read by
#      scripts/gpu/mgpu_overlap.py: the communication not overlapped by compute). Every rank
#      checks the ranks' weights bit-identical and equal to one runtime on the combined batch.
#      Then the same run with the ranks' memory limit at half of DDP's peak allocated bytes at
#      that n (dp_half_nN: its step / the unconstrained step, and its fingerprint — final weights
#      and losses — against the unconstrained run's; its reference check is skipped, the
#      fingerprint stands in). Buckets: the library's defaults, which are DDP's.
#   4. Fault: n = every visible GPU (needs >= 2), the bandwidth bench's --hold mode with the
#      communicator timeout MGPU_TIMEOUT_MS; the last rank is killed (SIGKILL) once all hold; each
#      other rank, still running at the kill, must exit 3 with a FAULT line (GKRT_STATUS_PEER_FAILED
#      after at least one good run) and "runtime still usable", within the timeout plus
#      MGPU_FAULT_SLACK_S seconds of the kill. With one GPU it is skipped and the
#      summary says "not run" (not a pass).
# Logs and $OUT/mgpu/summary.md (scripts/gpu/mgpu_summary.py). Exit status 1 when a run failed.
# Knobs: MGPU_PARTS ("bw dp fault": which of 1, 2-3, 4 run) MGPU_MAX_MIB (1024) MGPU_REPS (20)
#        MGPU_STEPS (20) MGPU_TRACE_STEPS (5) MGPU_PER_RANK (256) and the network: MGPU_IN (1024)
#        MGPU_WIDTH (4096) MGPU_OUT (1024) MGPU_DEPTH (4 weight layers) MGPU_LR (0.01): 168 MiB of
#        weights and of gradients all-reduced per step (gkrt's and DDP's alike), a step of ~65
#        GFLOP per rank (cuBLAS sgemm, and saxpy for SGD, in gkrt's host-callback nodes,
#        examples_c/blas_nodes.h).
#        MGPU_TIMEOUT_MS (20000) MGPU_FAULT_SLACK_S (10)

# Starts `n` ranks of a command (its flags after the first two arguments, "RANK" replaced by the
# rank), logs to $o/NAME_rankR.log; sets the array `mgpu_pids`.
mgpu_launch() {
  local name=$1 n=$2 r; shift 2
  mgpu_pids=()
  for ((r = 0; r < n; r++)); do
    "${@//RANK/$r}" >"$o/${name}_rank$r.log" 2>&1 &
    mgpu_pids+=($!)
  done
}

# Waits for every rank of the last mgpu_launch; prints each exit status; 0 when all were 0.
mgpu_wait() {
  local name=$1 r rc all=0
  for r in "${!mgpu_pids[@]}"; do
    wait "${mgpu_pids[$r]}"; rc=$?
    echo "mgpu: $name rank $r: exit $rc, last line: $(tail -n 1 "$o/${name}_rank$r.log")"
    [ $rc -eq 0 ] || all=1
  done
  return $all
}

run_mgpu() {
  export NCCL_NVLS_ENABLE=0
  local b=/tmp/gkrt-mgpu o="$OUT/mgpu" ok=1 n reg gpus counts=()
  mkdir -p "$b" "$o"
  rm -f "$b"/id* "$o"/fault.txt "$o"/dp_half_n*.txt
  cc -O2 benches/collective_bandwidth.c -Iinclude -I"$CUDA_HOME/include" -L.gpu/lib -lgkrt \
    -L"$CUDA_HOME/lib64/stubs" -lcuda -ldl -o "$b/collective_bandwidth" || return 1
  cc -O2 -ffp-contract=off examples_c/data_parallel/*.c -Iinclude -L.gpu/lib -lgkrt -lm -lpthread -ldl \
    -o "$b/gkrt_data_parallel" || return 1
  use_nccl || return 1
  gpus=$(nvidia-smi -L | wc -l)
  for n in 1 2 4 8; do [ "$n" -le "$gpus" ] && counts+=("$n"); done
  echo "mgpu: $gpus visible GPU(s): ranks ${counts[*]}; NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE" | tee "$o/gpus.txt"
  local max=${MGPU_MAX_MIB:-1024} reps=${MGPU_REPS:-20} parts=${MGPU_PARTS:-bw dp fault}

  if [[ " $parts " == *" bw "* ]]; then
    for n in "${counts[@]}"; do
      for reg in 1 0; do
        echo "--- bandwidth: $n rank(s), NCCL_LOCAL_REGISTER=$reg"
        NCCL_LOCAL_REGISTER=$reg mgpu_launch "bw_n${n}_reg$reg" "$n" timeout 600 "$b/collective_bandwidth" \
          --rank RANK --nranks "$n" --id-file "$b/id_bw_${n}_$reg" --max-mib "$max" --reps "$reps"
        mgpu_wait "bw_n${n}_reg$reg" || ok=0
        grep -vE '^\[gkrt' "$o/bw_n${n}_reg${reg}_rank0.log"
      done
    done
  fi
  if [[ " $parts " == *" dp "* ]]; then mgpu_dp || ok=0; fi
  if [[ " $parts " == *" fault "* ]]; then mgpu_fault "$gpus" || ok=0; fi
  python3 scripts/gpu/mgpu_summary.py "$o" | tee "$o/summary.md"
  [ $ok -eq 1 ]
}

# Parts 2 and 3 (see the top of this file) on every count in `counts`.
mgpu_dp() {
  local per=${MGPU_PER_RANK:-256} steps=${MGPU_STEPS:-20} tsteps=${MGPU_TRACE_STEPS:-5} n r half all=0
  local net=(--in "${MGPU_IN:-1024}" --width "${MGPU_WIDTH:-4096}" --out "${MGPU_OUT:-1024}"
    --depth "${MGPU_DEPTH:-4}" --lr "${MGPU_LR:-0.01}")
  echo "--- PyTorch DDP, the same network (${net[*]}), $per rows per rank"
  timeout 900 python3 benches/ddp_compare.py --n "${counts[@]}" --steps "$steps" --per-rank "$per" "${net[@]}" 2>&1 |
    tee "$o/ddp.log" | grep -E '^ddp'
  [ "${PIPESTATUS[0]}" -eq 0 ] || all=1
  for n in "${counts[@]}"; do
    # Its products call cuBLAS, opened with dlopen: CUDA's lib64 on its path only (last, after the
    # NCCL use_nccl found), so PyTorch keeps its own cuBLAS.
    local dp=(timeout 600 env "LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$CUDA_HOME/lib64" "$b/gkrt_data_parallel"
      --rank RANK --nranks "$n" --steps "$steps" --batch $((n * per)) "${net[@]}" --bucket-kib 0
      --trace-steps "$tsteps")
    echo "--- data-parallel example: $n rank(s), $per rows each, $steps timed and $tsteps traced steps"
    rm -rf "$o/dp_n${n}_trace" "$o/dp_half_n${n}_trace"
    mkdir -p "$o/dp_n${n}_trace" "$o/dp_half_n${n}_trace"
    GKRT_DEVICE=cuda mgpu_launch "dp_n$n" "$n" "${dp[@]}" --id-file "$b/id_dp_$n" --trace "$o/dp_n${n}_trace"
    mgpu_wait "dp_n$n" || all=1
    grep -E '^rank 0: (products|step time|memory|fingerprint)' "$o/dp_n${n}_rank0.log"
    python3 scripts/gpu/mgpu_overlap.py "$o/dp_n${n}_trace"/trace_rank*.json
    # Half of DDP's peak allocated bytes at this n, in whole MiB (rounded down).
    half=$(sed -nE "s/^ddp n=$n: .* peak allocated ([0-9.]+) MiB.*/\1/p" "$o/ddp.log" | awk '{ printf "%d", $1 / 2 }')
    if [ -z "$half" ] || [ "$half" -eq 0 ]; then
      echo "half memory: not run at n=$n: no DDP peak in ddp.log (NOT a pass)" | tee "$o/dp_half_n${n}.txt"
      all=1; continue
    fi
    echo "--- the same at half of DDP's memory: $half MiB per rank"
    GKRT_DEVICE=cuda mgpu_launch "dp_half_n$n" "$n" "${dp[@]}" --id-file "$b/id_dp_half_$n" \
      --trace "$o/dp_half_n${n}_trace" --memory-limit "$half" --reference 0
    mgpu_wait "dp_half_n$n" || all=1
    grep -E '^rank 0: (step time|memory|fingerprint)' "$o/dp_half_n${n}_rank0.log"
  done
  return $all
}

# The killed-rank check on all `gpus` GPUs (see the top of this file); writes $o/fault.txt. The
# ranks run without `timeout` (its process would take the SIGKILL, not the rank's): a survivor
# still running 60 s past the limit is killed here and counted as hung.
mgpu_fault() {
  local gpus=$1 timeout_ms=${MGPU_TIMEOUT_MS:-20000} slack=${MGPU_FAULT_SLACK_S:-10} r rc i
  if [ "$gpus" -lt 2 ]; then
    echo "fault: not run: needs 2 or more GPUs, $gpus visible (NOT a pass)" | tee "$o/fault.txt"
    return 0
  fi
  local n=$gpus victim=$((gpus - 1)) limit=$((timeout_ms / 1000 + slack))
  echo "--- fault: $n ranks holding 64 MiB all-reduces, timeout $timeout_ms ms; rank $victim killed"
  mgpu_launch fault "$n" "$b/collective_bandwidth" --rank RANK --nranks "$n" --id-file "$b/id_fault" \
    --timeout-ms "$timeout_ms" --hold 300
  # Kill only once every rank is inside its loop (after NCCL's setup), and a little later.
  for ((i = 0; i < 1200; i++)); do
    [ "$(cat "$o"/fault_rank*.log 2>/dev/null | grep -c '^rank .*: holding')" -ge "$n" ] && break
    sleep 0.1
  done
  sleep 2
  # A survivor that already stopped failed on its own, not because of the kill.
  local alive=()
  for ((r = 0; r < n; r++)); do kill -0 "${mgpu_pids[$r]}" 2>/dev/null && alive[$r]=1; done
  kill -KILL "${mgpu_pids[$victim]}"
  local t_kill exited=() after=()
  t_kill=$(date +%s%N)
  # Each survivor's exit time, polled every 0.1 s.
  for ((i = 0; i < (limit + 60) * 10; i++)); do
    local left=0
    for ((r = 0; r < n; r++)); do
      [ "$r" -eq "$victim" ] || [ -n "${exited[$r]:-}" ] && continue
      if kill -0 "${mgpu_pids[$r]}" 2>/dev/null; then left=1; else exited[$r]=1; after[$r]=$(( ($(date +%s%N) - t_kill) / 100000000 )); fi
    done
    [ $left -eq 0 ] && break
    sleep 0.1
  done
  local bad=0
  for ((r = 0; r < n; r++)); do
    if [ "$r" -ne "$victim" ] && [ -z "${exited[$r]:-}" ]; then
      kill -KILL "${mgpu_pids[$r]}"
      after[$r]=hung
    fi
    wait "${mgpu_pids[$r]}"; rc=$?
    [ "$r" -eq "$victim" ] && continue
    local log="$o/fault_rank$r.log" fault_line usable=no verdict=ok secs
    fault_line=$(grep -m1 '^FAULT' "$log" | cut -c1-300)
    grep -q 'runtime still usable' "$log" && usable=yes
    if [ "${after[$r]}" = hung ]; then
      secs="still running $((limit + 60))s after the kill (killed here)"; verdict=FAILED
    else
      secs="$((after[$r] / 10)).$((after[$r] % 10))s after the kill"
      [ "${after[$r]}" -le $((limit * 10)) ] || verdict=FAILED
    fi
    [ -n "${alive[$r]:-}" ] || secs="$secs, but it had exited BEFORE the kill"
    # The expected failure: PEER_FAILED after at least one good run (a rank that could not run at all is no test).
    { [ -n "${alive[$r]:-}" ] && [ "$rc" -eq 3 ] && [ $usable = yes ] &&
      grep -qE '\(([1-9][0-9]*) runs succeeded before\): GKRT_STATUS_PEER_FAILED' <<<"$fault_line"; } || verdict=FAILED
    [ $verdict = ok ] || bad=1
    echo "fault: rank $r exit $rc, $secs (limit ${limit}s), runtime usable: $usable: $verdict; ${fault_line:-no FAULT line}" |
      tee -a "$o/fault.txt"
  done
  [ $bad -eq 0 ] && echo "fault: every surviving rank failed with a status within the limit: PASS" | tee -a "$o/fault.txt"
  [ $bad -eq 0 ]
}
