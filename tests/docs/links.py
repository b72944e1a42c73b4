#!/usr/bin/env python3
"""Every relative link and every file path in backquotes that names a doc or a results
folder, in the project's Markdown, points at something that exists. Docs that describe
today must not point at history that git removed.

    tests/docs/links.py SOURCE_DIR
"""
import os
import re
import subprocess
import sys

src = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
files = subprocess.run(["git", "-C", src, "ls-files", "*.md"], capture_output=True,
                       text=True).stdout.split()
if not files:  # not a git checkout (a source tarball): walk instead
    for root, _, names in os.walk(src):
        if "/." in root or "/build" in root:
            continue
        files += [os.path.relpath(os.path.join(root, n), src) for n in names if n.endswith(".md")]

link = re.compile(r"\]\(([^)\s]+)\)")
named = re.compile(r"(?<![\w/.])((?:docs|bench/results)/[\w./-]+)")
bad = []
for rel in files:
    path = os.path.join(src, rel)
    base = os.path.dirname(path)
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            for target in link.findall(line):
                if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                    continue
                target = target.split("#")[0]
                if not os.path.exists(os.path.normpath(os.path.join(base, target))):
                    bad.append("%s:%d: link to %s: no such file" % (rel, n, target))
            for target in named.findall(line):
                target = target.rstrip(".")
                if not os.path.exists(os.path.join(src, target)):
                    bad.append("%s:%d: names %s: no such file" % (rel, n, target))
for b in bad:
    print(b)
print("%d Markdown files, %d broken references" % (len(files), len(bad)))
sys.exit(1 if bad else 0)
