# Sourced by the run scripts beside it. step NAME LIMIT CMD...: runs CMD under min(LIMIT, what is left of the call's
# budget: $END, in $SECONDS) into $R/NAME.log, skipped when under 10 s are left; prints its failures and its log's last
# $TAILN lines (default 6).
step() {
  local name=$1 lim=$2; shift 2
  local left=$((END - SECONDS - 15)); [ $left -lt 10 ] && { echo "== $name: skipped (no time)"; return; }
  [ $lim -gt $left ] && lim=$left
  echo "== $name ($lim s) $(date -u +%T)"; local t0=$SECONDS
  timeout -k 5 $lim "$@" > $R/$name.log 2>&1; echo "== $name rc=$? $((SECONDS - t0)) s"
  grep -E "(FAILED|ERROR) tests/|Error|error:" $R/$name.log | grep -v "^E  " | head -12 | cut -c1-250
  tail -n ${TAILN:-6} $R/$name.log | cut -c1-250
}
