#!/usr/bin/env python3
"""Lists the largest source files and functions of ddprun (the README's size budget: no file
over ~400 lines, no function over ~60). A heuristic, not a parser: a function is a brace block
opened on a line that looks like a signature (a name followed by a parameter list), lambdas and
control statements excluded.
Usage: scripts/size_report.py [--files N] [--functions N] [--limit-file L] [--limit-function L]"""
import argparse, os, re, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIRS = ["common", "rendezvous", "agent", "launcher", "runtime", "tests", "bench", "examples"]
CONTROL = re.compile(r"^\s*(?:\}\s*)?(?:if|for|while|switch|catch|else|do|try|return|namespace|struct|class|enum|union)\b")
SIGNATURE = re.compile(r"[\w:~>\]]+\s*\([^;]*\)\s*(?:const\s*)?(?:noexcept\s*)?(?:override\s*)?(?:->\s*[\w:<>]+\s*)?(?::[^;{]*)?\{\s*$")

def sources():
    for d in DIRS:
        for base, _, files in os.walk(os.path.join(ROOT, d)):
            for f in files:
                if f.endswith((".cpp", ".hpp", ".cu")):
                    yield os.path.join(base, f)

def functions(path):
    lines = open(path, encoding="utf-8", errors="replace").read().split("\n")
    out = []
    i = 0
    while i < len(lines):
        line = lines[i]
        text = line.split("//")[0]
        # a signature may span lines: join with the previous line when it ends in ',' or '('
        sig = text
        j = i
        while j > 0 and lines[j - 1].rstrip().endswith((",", "(")) and i - j < 4:
            j -= 1
            sig = lines[j].split("//")[0] + " " + sig
        if SIGNATURE.search(sig) and not CONTROL.search(sig) and "[" not in sig.split("(")[0] and "=" not in sig.split("(")[0]:
            depth = 0
            for k in range(i, len(lines)):
                depth += lines[k].count("{") - lines[k].count("}")
                if depth <= 0:
                    name = re.search(r"([\w:~]+)\s*\(", sig)
                    out.append((k - j + 1, name.group(1) if name else "?", j + 1))
                    i = k
                    break
        i += 1
    return out

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--functions", type=int, default=10)
    ap.add_argument("--limit-file", type=int, default=400)
    ap.add_argument("--limit-function", type=int, default=60)
    a = ap.parse_args()
    files, funcs = [], []
    for p in sources():
        rel = os.path.relpath(p, ROOT)
        n = sum(1 for _ in open(p, encoding="utf-8", errors="replace"))
        files.append((n, rel))
        funcs += [(n, f"{rel}:{line} {name}") for n, name, line in functions(p)]
    files.sort(reverse=True)
    funcs.sort(reverse=True)
    print(f"largest files (budget ~{a.limit_file} lines):")
    for n, rel in files[: a.files]:
        print(f"  {n:5d}  {rel}{'  OVER' if n > a.limit_file else ''}")
    print(f"largest functions (budget ~{a.limit_function} lines):")
    for n, what in funcs[: a.functions]:
        print(f"  {n:5d}  {what}{'  OVER' if n > a.limit_function else ''}")

if __name__ == "__main__":
    sys.exit(main())
