#!/usr/bin/env bash
# Runs Horovod's own PyTorch test file, test/parallel/test_torch.py of a
# Horovod checkout, unmodified, against tide.torch: `import horovod.torch as
# hvd` resolves to tide.torch through a shim package this script writes in a
# temporary directory (horovod/torch is tide.torch itself, the same module
# object). Each rank runs pytest on the whole file in one job (as Horovod's CI
# does) under tiderun, with HOROVOD_RANK/HOROVOD_SIZE set as horovodrun's
# Gloo mode sets them, so the file's per-test shutdown/init and rank checks
# apply. Prints passed/failed/skipped counts (a test passes when it passed on
# every rank) and the names of the tests that failed, with their first error
# line. docs/torch.md ("Horovod's own tests") has the results and the list of
# the tests that cannot apply, with why.
set -uo pipefail

me=horovod-tests
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$(dirname "$here")

usage() {
  cat <<'EOF2'
usage: scripts/horovod-tests.sh [options] HOROVOD_CHECKOUT

  HOROVOD_CHECKOUT     a Horovod source tree (git clone of horovod/horovod);
                       test/parallel/test_torch.py and test/utils are used

  --np N               ranks (default 2)
  --per-test           one tiderun job per test instead of the whole file
  --build DIR          tide build directory (default build)
  --python DIR         the directory holding the tide package (default python;
                       another tree's, to measure it with this script)
  -k EXPR              only the tests pytest's -k selects
  --timeout S          tiderun's limit for the job, seconds (default 1200;
                       per test with --per-test: 120)
  --keep               keep the temporary directory (shim, logs, junit files)
  --one-gpu            every rank its own host (TIDE_HOST_ID), so local_rank()
                       is 0 on all and the file's tensor.cuda(hvd.local_rank())
                       finds a machine's one GPU; the ranks talk over TCP

  PYTHON               the interpreter with torch (default /usr/bin/python3)
EOF2
}

np=2 per_test=0 build=$src/build pydir=$src/python select="" timeout="" keep=0 one_gpu=0
while [ $# -gt 0 ]; do
  case $1 in
    --np) np=$2; shift 2 ;;
    --per-test) per_test=1; shift ;;
    --build) build=$2; shift 2 ;;
    --python) pydir=$2; shift 2 ;;
    -k) select=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --one-gpu) one_gpu=1; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "$me: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -eq 1 ] || { usage >&2; exit 2; }
checkout=$(cd "$1" 2>/dev/null && pwd) || { echo "$me: HOROVOD_CHECKOUT '$1' is not a directory" >&2; exit 2; }
testfile=$checkout/test/parallel/test_torch.py
[ -f "$testfile" ] || { echo "$me: $testfile not found: HOROVOD_CHECKOUT must be a Horovod source tree" >&2; exit 2; }
case $np in ''|*[!0-9]*|0) echo "$me: --np must be a positive integer, got '$np'" >&2; exit 2 ;; esac
[ -x "$build/tools/tiderun" ] && [ -f "$build/libtide.so" ] ||
  { echo "$me: no tiderun/libtide.so in $build: build tide first or pass --build DIR" >&2; exit 2; }
py=${PYTHON:-/usr/bin/python3}
export PYTHON=$py TIDE_HVD_ONE_GPU=$one_gpu
missing=""
for m in torch numpy pytest packaging mock cloudpickle; do
  $py -c "import $m" 2>/dev/null || missing="$missing $m"
done
[ -z "$missing" ] ||
  { echo "$me: $py lacks:$missing (scripts/install-deps.sh installs python3-pytest and the rest)" >&2; exit 2; }

tmp=$(mktemp -d /tmp/horovod-tests.XXXXXX)
[ $keep = 1 ] || trap 'rm -rf "$tmp"' EXIT

# The shim: horovod.torch is tide.torch (the module object itself, so the
# file sees exactly tide.torch's names). Horovod's test/utils/common.py
# imports horovod.runner.util.threads; that one module is Horovod's own,
# loaded from the checkout (nothing of Horovod's is copied).
mkdir -p "$tmp/shim/horovod/torch" "$tmp/shim/horovod/runner/util"
echo '"""Shim for Horovod'"'"'s tests: horovod.torch is tide.torch."""' > "$tmp/shim/horovod/__init__.py"
cat > "$tmp/shim/horovod/torch/__init__.py" <<'EOF2'
import sys
import tide.torch
sys.modules[__name__] = tide.torch
EOF2
: > "$tmp/shim/horovod/runner/__init__.py"
: > "$tmp/shim/horovod/runner/util/__init__.py"
cat > "$tmp/shim/horovod/runner/util/threads.py" <<EOF2
# Horovod's own horovod/runner/util/threads.py, run from the checkout.
exec(compile(open("$checkout/horovod/runner/util/threads.py").read(), "$checkout/horovod/runner/util/threads.py", "exec"))
EOF2

# Each rank: horovodrun's Gloo-mode variables from tiderun's, then pytest.
# It exits 0 whatever pytest found (its status goes to a file), so that
# tiderun does not stop the other ranks while they finish the file.
cat > "$tmp/rank.sh" <<'EOF2'
#!/bin/sh
export HOROVOD_RANK=$TIDE_RANK HOROVOD_SIZE=$TIDE_SIZE HOROVOD_LOCAL_RANK=$TIDE_LOCAL_RANK
export HOROVOD_LOCAL_SIZE=$TIDE_LOCAL_SIZE
[ "$TIDE_HVD_ONE_GPU" = 1 ] && export TIDE_HOST_ID=rank$TIDE_RANK HOROVOD_LOCAL_RANK=0 HOROVOD_LOCAL_SIZE=1
out=$1; shift
"$PYTHON" -m pytest -p no:cacheprovider -q -rfEs -o junit_family=xunit1 \
  --junitxml="$out.$TIDE_RANK.xml" "$@" > "$out.$TIDE_RANK.log" 2>&1
echo $? > "$out.$TIDE_RANK.rc"
EOF2
chmod +x "$tmp/rank.sh"

[ -f "$pydir/tide/torch/__init__.py" ] || { echo "$me: no tide/torch package under --python $pydir" >&2; exit 2; }
export PYTHONPATH=$tmp/shim:$pydir${PYTHONPATH:+:$PYTHONPATH}
export TIDE_LIBRARY=$build/libtide.so
# A collective that waits for a call the other ranks never make fails within
# this deadline instead of hanging the job (tide's TIDE_TIMEOUT_MS).
export TIDE_TIMEOUT_MS=${TIDE_TIMEOUT_MS:-60000}
cd "$checkout/test/parallel" || exit 2

run_job() { # LABEL LIMIT PYTEST-ARGS...
  local label=$1 limit=$2; shift 2
  "$build/tools/tiderun" -np "$np" --timeout "$limit" "$tmp/rank.sh" "$tmp/junit.$label" "$@" \
    > "$tmp/tiderun.$label.log" 2>&1
}

args=(test_torch.py)
[ -n "$select" ] && args+=(-k "$select")
start=$(date +%s)
if [ $per_test = 0 ]; then
  run_job all "${timeout:-1200}" "${args[@]}"
  echo "$me: tiderun exited $? after $(( $(date +%s) - start )) s ($np ranks, whole file in one job)"
else
  $py -m pytest -p no:cacheprovider -q --collect-only "${args[@]}" 2>/dev/null | grep '::' > "$tmp/ids" ||
    { echo "$me: pytest collected no tests from $testfile" >&2; exit 1; }
  i=0
  while read -r id; do
    i=$((i + 1))
    run_job "t$i" "${timeout:-120}" "$id" || true
  done < "$tmp/ids"
  echo "$me: $i jobs (one per test, $np ranks) in $(( $(date +%s) - start )) s"
fi

# A test passed when it passed on every rank; failed when it failed or
# errored on any (or a rank has no record of it: that rank died first).
$py - "$tmp" "$np" <<'EOF2'
import glob, os, sys
import xml.etree.ElementTree as ET
tmp, np = sys.argv[1], int(sys.argv[2])
results = {}  # test -> {rank: (outcome, message)}
for path in glob.glob(os.path.join(tmp, "junit.*.xml")):
    rank = int(path.rsplit(".", 2)[1])
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        print("horovod-tests: %s unreadable: %s" % (path, e))
        continue
    for case in root.iter("testcase"):
        name = case.get("name")
        if not name:  # a session-level error record (an interrupted run), not a test
            continue
        outcome, msg = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = "skipped" if tag == "skipped" else "failed"
                msg = (el.get("message") or el.text or "").strip().splitlines()
                msg = msg[0][:200] if msg else ""
                break
        results.setdefault(name, {})[rank] = (outcome, msg)
passed, failed, skipped = [], [], []
for name in sorted(results):
    per = results[name]
    outcomes = [per.get(r, ("failed", "no result from rank %d (it died or hung)" % r)) for r in range(np)]
    bad = [(r, o) for r, o in enumerate(outcomes) if o[0] == "failed"]
    if bad:
        failed.append((name, "rank %d: %s" % (bad[0][0], bad[0][1][1])))
    elif all(o[0] == "skipped" for o in outcomes):
        skipped.append((name, outcomes[0][1]))
    elif all(o[0] == "passed" for o in outcomes):
        passed.append(name)
    else:
        failed.append((name, "skipped on some ranks only"))
print("horovod-tests: %d passed, %d failed, %d skipped (of %d tests, %d ranks)"
      % (len(passed), len(failed), len(skipped), len(results), np))
for name, msg in failed:
    print("FAILED %s: %s" % (name, msg))
for name, msg in skipped:
    print("SKIPPED %s: %s" % (name, msg))
sys.exit(1 if failed or not results else 0)
EOF2
rc=$?
[ $keep = 1 ] && echo "$me: logs in $tmp"
exit $rc
