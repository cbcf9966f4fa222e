#!/usr/bin/env python3
"""Per-category pass counts of s3-tests runs, from their JUnit XML (pytest --junitxml).

    s3-tests-table.py minio.xml blindfold.xml

A test falls in the first category whose pattern its name matches (the s3-tests names say
what they test; some of its pytest marks do not exist for every category)."""
import re
import sys
import xml.etree.ElementTree as ET

CATEGORIES = [
    ("lifecycle", r"lifecycle"),
    ("object lock", r"object_lock"),
    ("versioning", r"versioning|version"),
    ("tagging", r"tagging|tags"),
    ("ACL/policy", r"acl|policy"),
    ("SSE", r"sse|encryption"),
]


def category(name):
    for label, pattern in CATEGORIES:
        if re.search(pattern, name):
            return label
    return "other"


def results(path):
    """test name -> passed?"""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        failed = any(c.tag in ("failure", "error", "skipped") for c in case)
        key = case.get("name").split("[")[0]
        out[key] = out.get(key, True) and not failed
    return out


def main():
    runs = [results(p) for p in sys.argv[1:]]
    names = sorted(set().union(*runs))
    labels = [c[0] for c in CATEGORIES] + ["other", "total"]
    rows = {label: [0] + [0] * len(runs) for label in labels}
    for name in names:
        for label in (category(name), "total"):
            rows[label][0] += 1
            for i, r in enumerate(runs):
                rows[label][i + 1] += bool(r.get(name))
    heads = [p.rsplit("/", 1)[-1].removesuffix(".xml") for p in sys.argv[1:]]
    print(f"| category | cases | {' | '.join(heads)} |")
    print("|---|---:|" + "---:|" * len(heads))
    for label in labels:
        print(f"| {label} | " + " | ".join(str(n) for n in rows[label]) + " |")


if __name__ == "__main__":
    main()
