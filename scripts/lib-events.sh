# Shell helpers for scripts that drive an elastic gpurun run through its config file and event
# log (sourced by gpu-elastic.sh and gpu-main-job.sh).
# smi: our processes on the GPU ("pid, MiB;" each); count FILE KIND: decisions of that kind so
# far; wait_count FILE KIND N TIMEOUT_S (the caller sets gp=<gpurun pid>); cfg ACTIVE MODE FILE: write a config.
smi() { nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null | tr '\n' ';'; }
count() { local n; n=$(grep -c "\"event\": \"decision\".*\"kind\": \"$2\"" "$1" 2>/dev/null); echo "${n:-0}"; }
wait_count() {  # gives up when the timeout passes or gpurun ($gp, when set) has exited
  local end=$((SECONDS + $4)); while (( $(count "$1" "$2") < $3 )); do
    (( SECONDS > end )) && { echo "timeout waiting for $3 $2 decisions in $1"; return 1; }
    [[ -n ${gp:-} ]] && ! kill -0 "$gp" 2>/dev/null && { echo "gpurun exited while waiting for $3 $2 decisions"; return 1; }
    sleep 0.1; done; }
cfg() { printf 'active_gpus = %s\n[park]\nmode = "%s"\n[boundary]\ndeadline_s = 600\n' "$1" "$2" > "$3"; }
