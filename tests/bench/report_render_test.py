#!/usr/bin/env python3
"""keel-bench's report.html in headless Chromium (Debian `chromium`).

Generates a report with the fixture (tests/bench/fixture/report_fixture.cc), injects at the top
of <head> a probe that records uncaught errors, unhandled rejections, console.error/warn and
Content-Security-Policy violations (any fetch: the page must fetch nothing) into
<pre id="keel-console-errors">, loads the copy with --dump-dom and checks that nothing was
recorded and that the page has its parts: a curve per run in the loss and MFU charts, a marker
per incident in each, a timeline row per incident, an ETTR bar per policy run and a table row
per incident. Exits 77 (ctest: skipped) when chromium is not installed.

  report_render_test.py --fixture BIN [--html FILE] [--screenshot PNG]
"""
import argparse
import html.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

SKIP = 77

PROBE = """<meta http-equiv="Content-Security-Policy" content="default-src 'none'; \
style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src 'none'"/>
<script>(function () {
  var errs = [];
  function show() {
    if (!document.body) return;
    var p = document.getElementById('keel-console-errors');
    if (!p) {
      p = document.createElement('pre');
      p.id = 'keel-console-errors';
      document.body.appendChild(p);
    }
    p.textContent = errs.join('\\n');
  }
  function rec(m) { errs.push(String(m)); show(); }
  window.addEventListener('error', function (e) {
    rec('error: ' + (e.message || (e.target && (e.target.src || e.target.href)) || e.type));
  }, true);
  window.addEventListener('unhandledrejection', function (e) {
    rec('unhandledrejection: ' + e.reason);
  });
  document.addEventListener('securitypolicyviolation', function (e) {
    rec('fetch blocked: ' + e.blockedURI + ' (' + e.violatedDirective + ')');
  });
  ['error', 'warn'].forEach(function (k) {
    var orig = console[k];
    console[k] = function () {
      rec('console.' + k + ': ' + Array.prototype.join.call(arguments, ' '));
      return orig.apply(console, arguments);
    };
  });
  document.addEventListener('DOMContentLoaded', show);
  window.addEventListener('load', show);
})();</script>
"""


def find_chromium():
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


def chromium(binary, profile, *args):
    cmd = [binary, "--headless=new", "--no-sandbox", "--disable-gpu",
           "--user-data-dir=" + profile, "--host-resolver-rules=MAP * ~NOTFOUND",
           "--no-first-run", "--hide-scrollbars", *args]
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=90,
                          check=False, text=True)


class Dom(html.parser.HTMLParser):
    """The elements of a page: (tag, attrs, ids of the enclosing elements), and the text of
    each element with an id."""

    def __init__(self):
        super().__init__()
        self.stack, self.elements, self.text = [], [], {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.elements.append((tag, a, [e[1].get("id") for e in self.stack if e[1].get("id")]))
        if a.get("id"):
            self.text.setdefault(a["id"], "")
        if tag not in ("meta", "br", "hr", "img", "input", "link"):
            self.stack.append((tag, a))

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in ("meta", "br", "hr", "img", "input", "link"):
            self.stack.pop()

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                del self.stack[i:]
                break

    def handle_data(self, data):
        for _, a in self.stack:
            if a.get("id"):
                self.text[a["id"]] += data

    def count(self, tag, cls=None, inside=None):
        return sum(1 for t, a, ids in self.elements
                   if t == tag and (cls is None or cls in a.get("class", "").split())
                   and (inside is None or inside in ids))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixture", required=True, help="keel-bench-report-fixture")
    ap.add_argument("--html", help="check this page instead of the fixture's (its report.json "
                    "next to it)")
    ap.add_argument("--screenshot", help="also write a screenshot of the page here")
    args = ap.parse_args()

    binary = find_chromium()
    if not binary:
        print("SKIPPED: chromium is not installed (scripts/test.sh installs the Debian package "
              "`chromium` when it can)")
        return SKIP

    work = tempfile.mkdtemp(prefix="keel-report-render-")
    try:
        if args.html:
            page = args.html
        else:
            subprocess.run([args.fixture, work + "/out"], check=True)
            page = work + "/out/report.html"
        with open(page, encoding="utf-8") as f:
            text = f.read()
        with open(os.path.join(os.path.dirname(page), "report.json"), encoding="utf-8") as f:
            rep = json.load(f)
        failures = []

        # Nothing fetched: no remote (or any) resource reference in the page itself.
        for pat in (r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", r"url\(", r"@import",
                    r"<link\b", r"<img\b", r"<iframe\b"):
            if re.search(pat, text, re.I):
                failures.append("the page refers to a resource: /%s/" % pat)

        # The probe goes first in <head>, so it sees everything after it.
        head = re.search(r"<head[^>]*>", text)
        if not head:
            print("FAILED: the page has no <head>")
            return 1
        probed = work + "/probed.html"
        with open(probed, "w", encoding="utf-8") as f:
            f.write(text[:head.end()] + "\n" + PROBE + text[head.end():])
        res = chromium(binary, work + "/profile", "--dump-dom", "file://" + probed)
        if res.returncode != 0 or "</html>" not in res.stdout:
            print("FAILED: chromium --dump-dom exited %d\n%s" % (res.returncode, res.stderr[-3000:]))
            return 1
        for line in res.stderr.splitlines():  # what chromium logs of the page itself
            if "CONSOLE" in line or "Uncaught" in line:
                failures.append("chromium logged: " + line.strip())
        dom = Dom()
        dom.feed(res.stdout)

        if "keel-console-errors" not in dom.text:
            failures.append("the probe did not run (no #keel-console-errors in the DOM)")
        elif dom.text["keel-console-errors"].strip():
            failures.append("errors while rendering:\n" + dom.text["keel-console-errors"])

        runs = rep.get("runs", [])
        incidents = sum(len(r.get("incidents", [])) for r in runs)
        with_losses = sum(1 for r in runs if r.get("losses") and r.get("step_end_s"))
        # A step without record (null) breaks a run's curve: one polyline per stretch of
        # known values (the fixture's restart_all run has such a gap).
        def stretches(r, field):
            known = [v is not None and t is not None
                     for v, t in zip(r.get(field, []), r.get("step_end_s", []))]
            return sum(1 for i, k in enumerate(known) if k and (i == 0 or not known[i - 1]))
        loss_stretches = sum(stretches(r, "losses") for r in runs)
        mfu_stretches = sum(stretches(r, "step_mfu") for r in runs)
        if loss_stretches <= with_losses:
            failures.append("the fixture has no gap in its losses: the break is not checked")
        marked = sum(1 for r in runs for i in r.get("incidents", [])
                     if i.get("detected_at", 0) > 0 and r.get("started_at", 0) > 0)
        timed = sum(1 for r in runs for i in r.get("incidents", [])
                    if i.get("injected_at", 0) > 0 or i.get("detected_at", 0) > 0)
        expect = [
            ("loss chart curves", dom.count("polyline", "run-curve", "loss-chart"),
             loss_stretches),
            ("MFU chart curves", dom.count("polyline", "run-curve", "mfu-chart"), mfu_stretches),
            ("loss chart incident markers", dom.count("line", "incident-mark", "loss-chart"),
             marked),
            ("MFU chart incident markers", dom.count("line", "incident-mark", "mfu-chart"), marked),
            ("timeline rows", dom.count("g", "incident-row", "incident-timeline"), timed),
            ("ETTR bars", dom.count("rect", "ettr-bar", "ettr-bars"), max(len(runs) - 1, 0)),
            ("ETTR fault-free reference", dom.count("line", "ettr-reference", "ettr-bars"),
             1 if runs else 0),
            ("incident table rows", dom.count("tr", "incident", "incidents"), incidents),
            ("run table rows", dom.count("tr", "run", "runs"), len(runs)),
        ]
        for what, got, want in expect:
            print("%-28s %3d (want %d)" % (what, got, want))
            if got != want:
                failures.append("%s: %d, want %d" % (what, got, want))
        if timed and dom.count("rect", "phase", "incident-timeline") < timed:
            failures.append("timeline rows without phase spans")
        if not args.html and (incidents < 2 or len(runs) < 3):
            failures.append("the fixture has too little in it (%d runs, %d incidents)"
                            % (len(runs), incidents))

        if args.screenshot:
            shot = chromium(binary, work + "/profile", "--screenshot=" + args.screenshot,
                            "--window-size=1400,2400", "file://" + os.path.abspath(page))
            if shot.returncode != 0 or not os.path.exists(args.screenshot):
                failures.append("no screenshot: " + shot.stderr[-2000:])

        if failures:
            print("FAILED:\n  " + "\n  ".join(failures))
            return 1
        print("OK: report.html renders in %s without errors and has its parts" % binary)
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
