#!/usr/bin/env python3
"""Checks what `blindfold report --quick` wrote: report.md, its plots and report.json.

usage: check_report.py OUT_DIR --git|--no-git

The Markdown report must have the summary, a section per workload with our rows and the
thesis's, and (with --git) the git table; every plot it links must exist and be a well-formed SVG
with bars in it; report.json must hold every workload in both topologies with positive, finite
ratios, and (with --git) the git sides with the clone checked against the direct clone.
"""
import json
import math
import os
import sys
import xml.etree.ElementTree as ET


def fail(msg):
    print(f"REASON: {msg}", file=sys.stderr)
    sys.exit(1)


def main():
    out, git = sys.argv[1], sys.argv[2] == "--git"
    md = open(os.path.join(out, "report.md"), encoding="utf-8").read()
    for heading in ["## Summary", "## The git workload"] + [f"## Workload {w} " for w in "ABCDE"]:
        if heading not in md:
            fail(f"report.md has no {heading!r}")
    if md.count("The thesis (public cloud):") != 5:
        fail("report.md does not show the thesis's figures for every workload")
    for thesis in ["ObliviStore | 256KB | 8.50×", "RingORAM | 1MB | 87.1×"]:
        if thesis not in md:
            fail(f"the thesis's workload A row {thesis!r} is missing")

    # Every linked plot is a well-formed SVG with bars (rectangles beyond the background).
    links = [line.split("](", 1)[1].rstrip(")\n") for line in md.splitlines() if line.startswith("![")]
    want = 6 if git else 5
    if len(links) != want:
        fail(f"report.md links {len(links)} plots, expected {want}: {links}")
    for link in links:
        path = os.path.join(out, link)
        if not os.path.isfile(path):
            fail(f"plot {link} is linked but missing")
        root = ET.parse(path).getroot()
        rects = [e for e in root.iter() if e.tag.endswith("rect")]
        texts = "".join(e.text or "" for e in root.iter() if e.tag.endswith("text"))
        if len(rects) < 10:
            fail(f"{link}: only {len(rects)} rectangles, no bars")
        if "thesis" not in texts:
            fail(f"{link}: no thesis series in the legend")

    r = json.load(open(os.path.join(out, "report.json"), encoding="utf-8"))
    runs = r["workloads"]
    seen = {(x["topology"], x["report"]["spec"]["name"]) for x in runs}
    expected = {(t, w) for t in ("public", "private") for w in "ABCDE"}
    if seen != expected:
        fail(f"report.json runs {sorted(seen)}, expected {sorted(expected)}")
    for x in runs:
        for row in x["report"]["rows"]:
            for k in ("store_slowdown", "store_cost_multiplier", "store_bandwidth_overhead",
                      "store_response_ratio", "outsource_ratio", "outsource_ratio_thesis_capacity",
                      "slowdown"):
                v = row[k]
                if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                    fail(f"{x['topology']} {x['report']['spec']['name']}: {k} = {v}")
    if r["machine"]["cores"] < 1 or not r["started"]:
        fail("report.json does not say where and when it ran")
    if git:
        g = r["git"]
        if g is None:
            fail(f"the git workload did not run: {r['git_skipped']}")
        sides = g["sides"]
        if len(sides) < 3 or sides[0]["clone_ratio"] != 1.0:
            fail(f"git sides: {[s['target'] for s in sides]}")
        for s in sides:
            if not all(v > 0 for v in s["steps"].values()):
                fail(f"git side {s['target']}: a step took no time: {s['steps']}")
        if any(s["engine"] is None or not s["store_requests"] for s in sides[2:]):
            fail("an ORAM side of the git workload ran no engine or made no store requests")
        if "| the S3 server directly" not in md:
            fail("report.md has no git table")
    elif "Not run: no S3 server given" not in md:
        fail("report.md does not say why the git workload did not run")
    print(f"report ok: {len(runs)} workload runs, {len(links)} plots, took {r['seconds']:.0f} s")


main()
