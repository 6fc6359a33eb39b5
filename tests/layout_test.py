#!/usr/bin/env python3
"""The layout rule of docs/architecture.md, checked: every folder includes only the folders its
row of the "Layout" table allows. Run by ctest as layout.FoldersIncludeOnlyWhatTheirRowAllows.

An include "folder/x.h" names the folder; an include without a folder is the including folder's
own file, or else the file of that name in another folder (found by search), which then counts
as an include of that folder."""
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SOURCE_SUFFIXES = (".h", ".hpp", ".cpp", ".cu")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def read_rows():
    text = open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8").read()
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        path = cells[0].strip("`")
        allowed = set() if cells[2] == "-" else {a.strip() for a in cells[2].split(",")}
        rows[path] = allowed
    return rows


def sources(folder):
    for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
        for name in files:
            if name.endswith(SOURCE_SUFFIXES):
                yield os.path.join(dirpath, name)


def main():
    rows = read_rows()
    if not rows:
        print("docs/architecture.md has no Layout table")
        return 1
    name_of = {path: os.path.basename(path) for path in rows}
    by_name = {os.path.basename(path): path for path in rows}
    # Where each file name lives, for includes written without their folder.
    home_of_file = {}
    for path in rows:
        for source in sources(path):
            home_of_file.setdefault(os.path.basename(source), path)
    problems = []
    for path, allowed in rows.items():
        if not os.path.isdir(os.path.join(ROOT, path)):
            problems.append(f"{path}: in the table but not in the tree")
            continue
        own = name_of[path]
        for source in sources(path):
            rel = os.path.relpath(source, ROOT)
            for included in INCLUDE.findall(open(source, encoding="utf-8").read()):
                first = included.split("/", 1)[0]
                if "/" in included and first in by_name:
                    target = first
                elif "/" in included:
                    continue  # the folder's own subfolder (bench/finetune) or a generated file
                elif os.path.exists(os.path.join(os.path.dirname(source), included)):
                    continue
                elif included in home_of_file:
                    target = name_of[home_of_file[included]]
                else:
                    continue  # generated at build time
                if target != own and target not in allowed:
                    problems.append(f"{rel} includes \"{included}\": {own} may not include {target}")
    # Every runtime folder has a row: a new folder states what it owns and may include.
    for entry in sorted(os.listdir(os.path.join(ROOT, "runtime"))):
        if os.path.isdir(os.path.join(ROOT, "runtime", entry)) and entry != "include":
            if f"runtime/{entry}" not in rows:
                problems.append(f"runtime/{entry}: no row in docs/architecture.md's Layout table")
    for problem in problems:
        print(problem)
    print(f"{len(rows)} folders checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
