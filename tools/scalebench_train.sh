# The training mode of tools/scalebench.sh (--train): the demo model trained
# on the fake hosts, one run per consistency mode, and the time each takes to
# reach a target test accuracy. Sourced by scalebench.sh once its hosts are up;
# uses its settings (WORKDIR, SHARDPS_BIN, SCHED_ADDR, the TRAIN_* and link
# variables), its cluster_config, start_daemons, await_run and worker_host,
# and fakehosts.sh's start and wait_clients.
#
# Rank 0 runs with `shardps train --eval-every N` and writes a JSON line per
# evaluation (steps, the job's epochs, seconds without the evaluations, test
# accuracy; every N steps and of the final weights) to its log; the first
# line at or above the target gives the row's seconds_to_target. Every run is
# capped at TRAIN_EPOCHS epochs, so a mode that never reaches the target ends
# with null and its best accuracy.

# Checks the --train flags; sets TRAIN_MODES, TRAIN_SERVERS and the
# straggler's SLOW_RANK (-1: none), SLOW_FACTOR and SLOW_DESC.
validate_train_flags() {
  [[ $TRAIN_MODES_LIST =~ ^(sync|ssp|async)(,(sync|ssp|async))*$ ]] ||
    die "--modes must be a comma-separated list of sync, ssp, async; got '$TRAIN_MODES_LIST'"
  IFS=, read -r -a TRAIN_MODES <<<"$TRAIN_MODES_LIST"
  [[ $SERVERS_LIST =~ ^[1-9][0-9]*$ ]] || die "--servers: --train takes one server count, got '$SERVERS_LIST'"
  TRAIN_SERVERS=$SERVERS_LIST
  local flag v
  for flag in staleness=TRAIN_STALENESS epochs=TRAIN_EPOCHS eval-every=TRAIN_EVAL_EVERY train-limit=TRAIN_LIMIT \
    test-limit=TEST_LIMIT; do
    v=${flag#*=}
    [[ ${!v} =~ ^[0-9]+$ ]] || die "--${flag%%=*} must be a non-negative integer, got '${!v}'"
  done
  ((TRAIN_EPOCHS > 0 && TRAIN_EVAL_EVERY > 0)) || die "--epochs and --eval-every must be > 0"
  [[ $TARGET =~ ^(0?\.[0-9]+|1(\.0*)?)$ ]] && awk -v t="$TARGET" 'BEGIN { exit !(t > 0 && t <= 1) }' ||
    die "--target must be a test accuracy in (0, 1], got '$TARGET'"
  [[ -r $DATA_DIR/t10k-images-idx3-ubyte.gz ]] || die "--data-dir: no Fashion-MNIST in $DATA_DIR (Debian package dataset-fashion-mnist)"
  SLOW_RANK=-1 SLOW_FACTOR=1 SLOW_DESC=none
  if [[ $SLOW_SPEC != none ]]; then
    [[ $SLOW_SPEC =~ ^worker:([0-9]+)=([0-9]+(\.[0-9]+)?)$ ]] ||
      die "--slow must be worker:RANK=FACTOR (e.g. worker:1=3) or none, got '$SLOW_SPEC'"
    SLOW_RANK=${BASH_REMATCH[1]} SLOW_FACTOR=${BASH_REMATCH[2]} SLOW_DESC="worker $SLOW_RANK ${SLOW_FACTOR}x slower"
    [[ $WORKERS =~ ^[0-9]+$ ]] && ((SLOW_RANK < WORKERS)) || die "--slow: worker rank $SLOW_RANK is not below --workers $WORKERS"
    awk -v f="$SLOW_FACTOR" 'BEGIN { exit !(f >= 1 && f <= 1000) }' || die "--slow: factor $SLOW_FACTOR is not in [1, 1000]"
  fi
}

# train_config MODE: the cluster config of one run (the demo's optimizer,
# Adam with learning rate 0.001).
train_config() {
  cluster_config "$1" "$TRAIN_SERVERS"
  if [[ $1 == ssp ]]; then echo "staleness: $TRAIN_STALENESS"; fi
}

# run_train MODE: scheduler, TRAIN_SERVERS servers, one `shardps train` per
# worker host (worker SLOW_RANK SLOW_FACTOR times slower); waits for every
# worker. Writes WORKDIR/train-MODE/result.R and the logs there.
run_train() {
  local mode=$1 dir=$WORKDIR/train-$1 h r factor every
  mkdir -p "$dir"
  rm -f "$dir"/result.*
  train_config "$mode" >"$dir/cluster.pbtxt"
  start_daemons "$dir" "$TRAIN_SERVERS"
  local nd=${#PIDS[@]}
  for ((r = 0; r < WORKERS; r++)); do
    h=$(worker_host "$r") factor=1 every=0
    ((r == SLOW_RANK)) && factor=$SLOW_FACTOR
    ((r == 0)) && every=$TRAIN_EVAL_EVERY
    start "$h" "worker rank $r" "$dir/h$h.worker.log" "$SHARDPS_BIN" train --scheduler "$SCHED_ADDR" \
      --rank "$r" --epochs "$TRAIN_EPOCHS" --slow-factor "$factor" --eval-every "$every" --log-every 0 \
      --train-limit "$TRAIN_LIMIT" --test-limit "$TEST_LIMIT" --data-dir "$DATA_DIR" --result-file "$dir/result.$r"
  done
  await_run "$nd" "training run '$mode'" "$dir"
  for ((r = 0; r < WORKERS; r++)); do
    [[ -s $dir/result.$r ]] || die "worker rank $r wrote no result file $dir/result.$r"
  done
  sed -nE 's/^\{"eval_step": ([0-9]+), "epochs": ([0-9.]+), "seconds": ([0-9.]+), "eval_seconds": ([0-9.]+), "test_accuracy": ([0-9.]+), "final": (true|false)\}$/\1 \2 \3 \4 \5 \6/p' \
    "$dir/h$(worker_host 0).worker.log" >"$dir/points"
  [[ -s $dir/points && $(tail -n 1 "$dir/points") == *" true" ]] ||
    die "worker rank 0 printed no accuracy line of the final weights ($dir/h$(worker_host 0).worker.log)"
}

result_value() { awk -v k="$2" '$1 == k { print $2 }' "$1"; }

# train_summary MODE: one run's figures, formatted once for its JSON row and
# its table line: "SECONDS_TO_TARGET EPOCHS_TO_TARGET SECONDS_TO_STAY BEST FINAL
# EPOCHS TRAIN_SECONDS EVAL_SECONDS SAMPLES_PER_S", null where not reached.
train_summary() {
  local dir=$WORKDIR/train-$1 samples=0 r
  for ((r = 0; r < WORKERS; r++)); do samples=$((samples + $(result_value "$dir/result.$r" samples))); done
  # points: step epochs seconds eval_seconds accuracy final, in order; the last
  # one is the final weights'.
  # seconds_to_stay: the first point from which every later one is at or above the target.
  awk -v target="$TARGET" -v final="$(result_value "$dir/result.0" test_accuracy)" -v samples="$samples" '
    function num(x, fmt) { return x == "" ? "null" : sprintf(fmt, x) }
    { if ($5 > best) best = $5; epochs = $2; seconds = $3; ev = $4
      if (reached == "" && $5 >= target) { reached = $3; reached_epochs = $2 }
      if ($5 < target) stay = ""; else if (stay == "") stay = $3 }
    END {
      printf "%s %s %s %.4f %.4f %.2f %.1f %.1f %.0f\n", num(reached, "%.1f"), num(reached_epochs, "%.2f"),
        num(stay, "%.1f"), best, final, epochs, seconds, ev, samples / seconds
    }' "$dir/points"
}

# train_row MODE SUMMARY: the JSON object of one run (without its curve).
train_row() {
  local mode=$1 staleness=null straggler=null reached reached_epochs stay best final epochs seconds ev rate
  read -r reached reached_epochs stay best final epochs seconds ev rate <<<"$2"
  [[ $mode == ssp ]] && staleness=$TRAIN_STALENESS
  ((SLOW_RANK >= 0)) && straggler="\"worker:$SLOW_RANK=$SLOW_FACTOR\""
  printf '{"mode":"train","consistency":"%s","staleness":%s,"servers":%d,"workers":%d,"straggler":%s,' \
    "$mode" "$staleness" "$TRAIN_SERVERS" "$WORKERS" "$straggler"
  printf '"replication":%d,"server_rate":"%s","worker_rate":"%s",' "$REPLICATION" "$SERVER_RATE" "$WORKER_RATE"
  printf '"target":%s,"seconds_to_target":%s,"epochs_to_target":%s,"seconds_to_stay":%s,' "$TARGET" "$reached" \
    "$reached_epochs" "$stay"
  printf '"best_accuracy":%s,"final_accuracy":%s,"epochs":%s,' "$best" "$final" "$epochs"
  printf '"train_seconds":%s,"eval_seconds":%s,"samples_per_s":%s}\n' "$seconds" "$ev" "$rate"
}

# train_table_line MODE SUMMARY: one run's line of the table without --json.
train_table_line() {
  local reached reached_epochs stay best final epochs seconds ev rate
  read -r reached reached_epochs stay best final epochs seconds ev rate <<<"$2"
  [[ $reached == null ]] && reached="not reached"
  [[ $reached_epochs == null ]] && reached_epochs=-
  [[ $stay == null ]] && stay=-
  printf '%-6s %12s %10s %10s %8s %8s %7s %10s\n' "$1" "$reached" "$reached_epochs" "$stay" "$best" "$final" \
    "$epochs" "$rate"
}

# train_curve MODE: {"consistency": MODE, "target": T, "title": ..., "points": [[seconds, accuracy], ...]}.
train_curve() {
  local title="$WORKERS workers (straggler: $SLOW_DESC), $TRAIN_SERVERS servers at $SERVER_RATE"
  awk -v mode="$1" -v target="$TARGET" -v title="$title" '
    { pts = pts (NR > 1 ? "," : "") sprintf("[%s,%s]", $3, $5) }
    END { printf "{\"consistency\":\"%s\",\"target\":%s,\"title\":\"%s\",\"points\":[%s]}\n", mode, target, title, pts }' \
    "$WORKDIR/train-$1/points"
}

# The table of --train without --json: its heading, then the runs' lines.
print_train_table() {
  echo
  echo "$WORKERS workers at $WORKER_RATE (straggler: ${SLOW_DESC}), $TRAIN_SERVERS servers at $SERVER_RATE;" \
    "target test accuracy $TARGET, at most $TRAIN_EPOCHS epochs"
  printf '%-6s %12s %10s %10s %8s %8s %7s %10s\n' mode "s to target" "ep. to tgt" "s to stay" best final epochs samples/s
  printf '%s' "$@"
}

# Runs every mode of TRAIN_MODES; writes WORKDIR/results.jsonl and
# WORKDIR/curves.jsonl, prints the rows (table or --json) from what it
# computed, and plots the curves.
run_training_modes() {
  local mode summary row rows=() lines=()
  : >"$WORKDIR/results.jsonl"
  : >"$WORKDIR/curves.jsonl"
  for mode in "${TRAIN_MODES[@]}"; do
    log "[train $mode] $WORKERS workers ($SLOW_DESC), $TRAIN_SERVERS servers, at most $TRAIN_EPOCHS epochs"
    run_train "$mode"
    summary=$(train_summary "$mode")
    row=$(train_row "$mode" "$summary")
    echo "$row" >>"$WORKDIR/results.jsonl"
    rows+=("$row"$'\n')
    lines+=("$(train_table_line "$mode" "$summary")"$'\n')
    train_curve "$mode" >>"$WORKDIR/curves.jsonl"
    log "[train $mode] $row"
  done
  if ((JSON)); then printf '%s' "${rows[@]}"; else print_train_table "${lines[@]}"; fi
  if [[ $PLOT != none ]]; then
    ensure_matplotlib
    /usr/bin/python3 "$ROOT/tools/scalebench_plot.py" --train "$WORKDIR/curves.jsonl" "$PLOT" ||
      die "plotting $WORKDIR/curves.jsonl into $PLOT failed"
    log "plot: $PLOT"
  fi
}
