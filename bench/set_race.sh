#!/usr/bin/env bash
# Issue 44 #2, by hand (not in CI): ROUNDS rounds of `gpurun set` racing a hand edit of
# config.toml. MODE=one: one in-place append per round, at a random moment of the set;
# MODE=storm: a shell appends in a tight loop for the whole life of each set;
# MODE=sed: `sed -i '$a # edit …'` (an editor-style save: read, write a temp file, rename it
# over config.toml) in a tight loop for the whole life of each set.
# Prints the hand edits lost silently (must be 0), those kept in a temp file and said
# ("edited twice"), and the set successes whose change is not in the file at the end (0 for
# one and storm; with sed, a save that read the file before set's rename and renamed after
# it overwrites set's change, as it would any program's: counted, not a gpurun loss).
# Usage: bench/set_race.sh [GPURUN] [ROUNDS] [one|storm|sed]
GPURUN=${1:-build/launcher/gpurun} ROUNDS=${2:-200} MODE=${3:-one}
d=$(mktemp -d); cfg=$d/config.toml; trap 'rm -rf "$d"' EXIT
printf 'active_gpus = [0, 1]\n\n[park]\nmode = "release"\n' > "$cfg"
edits=0 lost=0 said=0 ok=0 refused=0 lost_set=0
for i in $(seq 1 "$ROUNDS"); do
  mode=$( ((i % 2)) && echo release || echo hold)
  if [[ $MODE == sed ]]; then
    (k=0; while [[ ! -e $d/stop ]]; do k=$((k + 1)); sed -i "\$a # edit $i.$k" "$cfg"; done; echo $k > "$d/n") &
  elif [[ $MODE == storm ]]; then
    (k=0; while [[ ! -e $d/stop ]]; do k=$((k + 1)); echo "# edit $i.$k" >> "$cfg"; done; echo $k > "$d/n") &
  else
    (sleep 0.00$((RANDOM % 9)); echo "# edit $i.1" >> "$cfg"; echo 1 > "$d/n") &
  fi
  w=$!; rc=0; "$GPURUN" set --config "$cfg" park.mode=$mode > /dev/null 2> "$d/err" || rc=$?
  touch "$d/stop"; wait $w; rm -f "$d/stop"
  n=$(cat "$d/n"); have=$(grep -c "^# edit $i\." "$cfg"); edits=$((edits + n))
  if grep -q "edited twice" "$d/err"; then said=$((said + n - have)); else lost=$((lost + n - have)); fi
  if ((rc == 0)); then ok=$((ok + 1)); grep -q "^mode = \"$mode\"" "$cfg" || lost_set=$((lost_set + 1))
  else refused=$((refused + 1)); fi
  grep -v '^# edit ' "$cfg" > "$d/c"; cat "$d/c" > "$cfg"
done
echo "$MODE: rounds=$ROUNDS hand_edits=$edits lost_silently=$lost kept_aside_and_said=$said" \
  "set_ok=$ok set_refused=$refused set_changes_lost=$lost_set"
