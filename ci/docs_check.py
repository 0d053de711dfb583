#!/usr/bin/env python3
"""The manual's promises, checked (issue 62): every page of docs/ is reachable from docs/index.md
and from the README's list; every relative link in the README and docs/ names a file that exists
and, where it has one, an anchor that a heading of that file makes (GitHub's rule: lower case,
punctuation dropped, spaces as hyphens, -1, -2 for repeats); docs/workloads.md lists exactly the
workloads the code knows, each with exactly the shape keys its parser accepts (read from the
binary's own errors: the unknown-workload list and each workload's unknown-key list); every
shell block (```sh) says whether a test runs it: the line above it is `<!-- runs in
ci/docs_test.sh -->` or `<!-- not run by a test: WHY -->`.

Usage: ci/docs_check.py SOURCE [STRATBENCH]   (without STRATBENCH the workload check is skipped)
       ci/docs_check.py SOURCE --run BUILD WORK   runs every block marked as run, each in WORK
                                                  (a folder that looks like the checkout, build/
                                                  being BUILD, /tmp/ inside WORK), and says which
                                                  failed
Exit 0 when everything holds, 1 with every problem listed.
"""
import os
import re
import subprocess
import sys
import tempfile

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)  # letters, digits, _, -, spaces stay
    return s.replace(" ", "-")


def anchors(path):
    out, seen, fence = set(), {}, False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            fence = not fence
            continue
        m = re.match(r"^(#+)\s+(.*?)\s*#*\s*$", line)
        if fence or not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path):
    fence = False
    for no, line in enumerate(open(path, encoding="utf-8"), 1):
        if line.startswith("```"):
            fence = not fence
            continue
        if fence:
            continue
        for target in LINK.findall(line):
            yield no, target


def manual_pages(src):
    """The README and every page of docs/."""
    return [os.path.join(src, "README.md")] + sorted(
        os.path.join(src, "docs", f) for f in os.listdir(os.path.join(src, "docs"))
        if f.endswith(".md"))


def check_links(src, problems):
    pages = manual_pages(src)
    cache = {}
    for page in pages:
        for no, target in links(page):
            if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            where = f"{os.path.relpath(page, src)}:{no}"
            if not os.path.exists(dest):
                problems.append(f"{where}: link to {target}: no such file")
                continue
            if anchor and dest.endswith(".md"):
                if dest not in cache:
                    cache[dest] = anchors(dest)
                if anchor not in cache[dest]:
                    problems.append(f"{where}: link to {target}: no heading makes #{anchor}")


def check_reachable(src, problems):
    docs = sorted(f for f in os.listdir(os.path.join(src, "docs"))
                  if f.endswith(".md") and f != "index.md")
    index = {t.partition("#")[0] for _, t in links(os.path.join(src, "docs", "index.md"))}
    readme = {os.path.basename(t.partition("#")[0])
              for _, t in links(os.path.join(src, "README.md")) if t.startswith("docs/")}
    for d in docs:
        if d not in index:
            problems.append(f"docs/index.md does not link docs/{d}")
        if d not in readme:
            problems.append(f"README.md does not link docs/{d}")


def run_error(sb, workload, shape):
    with tempfile.TemporaryDirectory() as tmp:
        suite = os.path.join(tmp, "w.yaml")
        with open(suite, "w") as f:
            f.write(f"suite: w\ncases:\n  - name: a\n    workload: {workload}\n"
                    f"    shape: {shape}\n    mesh: 1\n    strategies: [\"sharding/fsdp/ddp\"]\n")
        p = subprocess.run([sb, "run", suite, "--out", os.path.join(tmp, "out")],
                           capture_output=True, text=True)
        return p.returncode, p.stdout + p.stderr


def check_workloads(src, sb, problems):
    rc, text = run_error(sb, "no_such_workload", "{}")
    m = re.search(r"unknown workload 'no_such_workload' \(known: ([^)]*)\)", text)
    if rc != 2 or not m:
        problems.append(f"the unknown-workload error did not list the workloads: {text[-300:]}")
        return
    known = [w.strip() for w in m.group(1).split(",")]
    page = os.path.join(src, "docs", "workloads.md")
    documented, section = {}, None
    for line in open(page, encoding="utf-8"):
        h = re.match(r"^## `([^`]+)`\s*$", line)
        if h:
            section = h.group(1)
            documented[section] = set()
            continue
        row = re.match(r"^\|\s*`([^`]+)`\s*\|", line)
        if section and row:
            documented[section].add(row.group(1))
    for w in known:
        if w not in documented:
            problems.append(f"docs/workloads.md has no section for workload '{w}'")
    for w in documented:
        if w not in known:
            problems.append(f"docs/workloads.md documents '{w}', which the code does not know")
    for w in known:
        if w not in documented:
            continue
        rc, text = run_error(sb, w, "{sb_no_such_key: 1}")
        if w == "op":
            keys = {"op"}
        else:
            k = re.search(r"unknown shape key 'sb_no_such_key' \(expected ([^)]*)\)", text)
            if rc != 2 or not k:
                problems.append(f"workload '{w}': its unknown-key error lists no keys: {text[-300:]}")
                continue
            keys = {x.strip() for x in k.group(1).split(",")}
        if keys != documented[w]:
            problems.append(f"docs/workloads.md, workload '{w}': keys {sorted(documented[w])}, "
                            f"the code's {sorted(keys)}")


RUNS = "<!-- runs in ci/docs_test.sh -->"
NOT_RUN = re.compile(r"^<!-- not run by a test: (\S.*?) -->$")


def sh_blocks(src):
    """(page, line, mark line or None, text) of every ```sh block of the README and docs/."""
    pages = manual_pages(src)
    for page in pages:
        lines = open(page, encoding="utf-8").read().split("\n")
        i = 0
        while i < len(lines):
            if lines[i].startswith("```"):
                start, lang = i, lines[i][3:].strip()
                i += 1
                while i < len(lines) and not lines[i].startswith("```"):
                    i += 1
                if lang == "sh":
                    above = start - 1
                    while above >= 0 and not lines[above].strip():
                        above -= 1
                    mark = lines[above].strip() if above >= 0 else None
                    yield (os.path.relpath(page, src), start + 1, mark,
                           "\n".join(lines[start + 1:i]))
            i += 1


def check_sh_blocks(src, problems):
    for page, line, mark, _ in sh_blocks(src):
        if mark != RUNS and not (mark and NOT_RUN.match(mark)):
            problems.append(f"{page}:{line}: a shell block that does not say whether a test runs "
                            f"it (the line above it: '{RUNS}' or '<!-- not run by a test: WHY -->')")


def run_blocks(src, build, work):
    """Runs every block marked as run; returns how many failed."""
    src, build = os.path.abspath(src), os.path.abspath(build)
    os.makedirs(os.path.join(work, "tmp"), exist_ok=True)
    for entry in os.listdir(src):
        if entry not in ("build", "tmp") and not os.path.exists(os.path.join(work, entry)):
            os.symlink(os.path.join(src, entry), os.path.join(work, entry))
    if not os.path.exists(os.path.join(work, "build")):
        os.symlink(build, os.path.join(work, "build"))
    failed = ran = 0
    for page, line, mark, text in sh_blocks(src):
        if mark != RUNS:
            continue
        ran += 1
        script = text.replace("/tmp/", os.path.join(os.path.abspath(work), "tmp") + "/")
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=work,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=900)
        if r.returncode == 0:
            print(f"docs: {page}:{line}: ran, exit 0")
        else:
            failed += 1
            print(f"docs: {page}:{line}: exit {r.returncode}; its last output:\n{r.stdout[-3000:]}")
    print(f"docs: {ran} block(s) run, {failed} failed")
    return failed


def main():
    src = sys.argv[1]
    if len(sys.argv) == 5 and sys.argv[2] == "--run":
        return 1 if run_blocks(src, sys.argv[3], sys.argv[4]) else 0
    problems = []
    check_sh_blocks(src, problems)
    check_links(src, problems)
    check_reachable(src, problems)
    if len(sys.argv) > 2:
        check_workloads(src, sys.argv[2], problems)
    for p in problems:
        print("docs:", p)
    print(f"docs: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
