# Sourced by the device-call scripts: `R=/tmp/sNNcM; . benchmarks/runs/step.sh`, then
# `step NAME LIMIT command...` runs the command under `timeout LIMIT` into $R/NAME.log, prints the
# log's last ${TAILN:-14} lines, and packs $R into $OUT/results.tgz after every step, so a call
# cut by its time limit still brings back what finished.
mkdir -p "$R"
step() {
    local name=$1 limit=$2
    shift 2
    echo "=== $name $(date +%T)"
    timeout "$limit" "$@" > "$R/$name.log" 2>&1
    local rc=$?
    echo "exit $rc" >> "$R/$name.log"
    tail -n "${TAILN:-14}" "$R/$name.log"
    tar czf "$OUT/results.tgz" -C "$(dirname "$R")" "$(basename "$R")"
    return $rc
}
