#!/usr/bin/env bash
# Builds keel (CUDA too when nvcc is found) and runs every test with CTest. GPU tests skip
# without a GPU. Extra arguments go to ctest (e.g. -R Training).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KEEL_BUILD_DIR:-$root/build}
KEEL_BUILD_DIR="$build" "$root/scripts/build.sh"
# The report.html render test (tests/bench/report_render_test.py) opens the page in Debian's
# chromium. A failed install fails nothing: that test then skips and says why.
if ! command -v chromium >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo -n"
  echo "test.sh: installing chromium for the report.html render test"
  { $sudo apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium \
      >/dev/null; } || echo "test.sh: chromium could not be installed; the render test skips"
fi
cd "$build"
junit="$build/ctest-junit.xml"
rm -f "$junit"
junit_args=()
# CMake >= 3.21; grep reads all of the help (no -q: an early exit would fail the pipe).
if ctest --help 2>/dev/null | grep -- --output-junit >/dev/null; then
  junit_args=(--output-junit "$junit")
fi
set +e
ctest --output-on-failure --timeout 900 -j "$(nproc)" "${junit_args[@]}" "$@" | tee "$build/ctest.log"
status=${PIPESTATUS[0]}
set -e

# Skipped tests, with the reason each gave: a skip is for what this machine cannot run (no GPU,
# no root, no mpirun, no tensorboard), and a CI log must show how much of the suite did not
# run. CTest's JUnit file has the skipped tests and their output; the reason is the text a
# GoogleTest skip prints after "Skipped" (or a script's line that says SKIPPED/skipped).
if [ -s "$junit" ] && command -v python3 >/dev/null 2>&1; then
  python3 - "$junit" <<'PY' || echo "test.sh: could not read the skipped tests from $junit"
import re, sys
import xml.etree.ElementTree as ET

def reason(out):
    lines = [l.strip() for l in (out or "").splitlines()]
    for i, l in enumerate(lines):
        if re.search(r": Skipped$", l):  # GoogleTest: "file.cc:12: Skipped", then the message
            msg = []
            for m in lines[i + 1:]:
                if not m or m.startswith("[  SKIPPED ]"):
                    break
                msg.append(m)
            if msg:
                return " ".join(msg)
    for l in lines:
        if re.match(r"(?i)skipped\b[: ]", l):  # a script's own line
            return re.sub(r"(?i)^skipped\W*", "", l)
    return "(no reason printed)"

skipped = []
for case in ET.parse(sys.argv[1]).getroot().iter("testcase"):
    s = case.find("skipped")
    if s is not None:
        skipped.append((case.get("name"), reason(case.findtext("system-out"))))
print("\ntest.sh: %d test(s) skipped%s" % (len(skipped), ":" if skipped else ""))
for name, why in sorted(skipped):
    print("  %s: %s" % (name, why))
PY
else
  echo "test.sh: no skip summary (no JUnit file from ctest, or no python3)"
fi
# CTest's verdict last, where a reader of the log looks for it.
grep -E '^[0-9]+% tests passed' "$build/ctest.log" | tail -1 || true
exit "$status"
