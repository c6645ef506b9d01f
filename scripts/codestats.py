#!/usr/bin/env python3
"""The numbers issue 33 asks for, measured on the tree (not tests): the longest functions, the
files over 1,500 lines, the `match` sites on `Request`, and the fixed sleeps in tests.

    scripts/codestats.py [--top N] [--json]

A function's length is from its `fn` line to the line closing its body (braces counted outside
strings, chars and comments); `#[cfg(test)]` modules and files under tests/ are left out of the
function and file figures."""
import argparse, json, os, re, signal, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FN = re.compile(r'^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+"C"\s+)?fn\s+(\w+)')


def rust_files():
    for base in ("crates",):
        for d, dirs, files in os.walk(os.path.join(ROOT, base)):
            dirs[:] = [x for x in dirs if x not in ("target",)]
            for f in files:
                if f.endswith(".rs"):
                    yield os.path.join(d, f)


def code_only(line, state):
    """The line without strings, chars and comments; state carries a block comment or raw string."""
    out, i, n = [], 0, len(line)
    while i < n:
        if state["block"]:
            j = line.find("*/", i)
            if j < 0:
                return "".join(out)
            state["block"], i = False, j + 2
            continue
        if state["str"]:
            c = line[i]
            if c == "\\":
                i += 2
                continue
            if c == '"':
                state["str"] = False
            i += 1
            continue
        c = line[i]
        if line.startswith("//", i):
            break
        if line.startswith("/*", i):
            state["block"], i = True, i + 2
            continue
        if c == '"':
            state["str"], i = True, i + 1
            continue
        if c == "'":
            m = re.match(r"'(\\.|[^\\'])'", line[i:]) or re.match(r"'\\u\{[0-9a-fA-F]+\}'", line[i:])
            if m:
                i += len(m.group(0))
                continue
        if c == "r" and re.match(r'r#*"', line[i:]):
            m = re.match(r'r(#*)"', line[i:])
            end = '"' + m.group(1)
            j = line.find(end, i + len(m.group(0)))
            if j < 0:
                return "".join(out)  # multi-line raw strings: rare, braces in them ignored
            i = j + len(end)
            continue
        out.append(c)
        i += 1
    return "".join(out)


def functions(path):
    lines = open(path, encoding="utf-8", errors="replace").read().split("\n")
    state = {"block": False, "str": False}
    depth, stack, test_depth, found = 0, [], None, []
    pending_test = False
    for no, raw in enumerate(lines, 1):
        code = code_only(raw, state)
        if "#[cfg(test)]" in raw:
            pending_test = True
        m = FN.match(code)
        if m and test_depth is None:
            stack.append((m.group(7), no, depth))
        if pending_test and re.match(r"\s*(pub\s+)?mod\s+\w+", code) and "{" in code:
            test_depth, pending_test = depth, False
        for ch in code:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if test_depth is not None and depth == test_depth:
                    test_depth = None
                while stack and depth == stack[-1][2]:
                    name, start, _ = stack.pop()
                    found.append((no - start + 1, name, start))
        if m and ";" in code and "{" not in code and stack and stack[-1][1] == no:
            stack.pop()  # a declaration without a body
    return found, len(lines)


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends it quietly
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--top", type=int, default=10, help="how many of the longest functions (10)")
    ap.add_argument("--json", action="store_true", help="one JSON object")
    a = ap.parse_args()
    fns, big, matches, sleeps = [], [], [], []
    for p in rust_files():
        rel = os.path.relpath(p, ROOT)
        in_tests = "/tests/" in rel or "/benches/" in rel
        text = open(p, encoding="utf-8", errors="replace").read()
        if not in_tests:
            f, _ = functions(p)
            fns += [(l, f"{rel}:{s} {name}") for l, name, s in f]
            body = text.split("#[cfg(test)]")[0]
            n = body.count("\n")
            if n > 1500:
                big.append((n, rel))
            for m in re.finditer(r"match\s+[^{;]*\{\s*\n?\s*(surge_proto::)?Request::", body):
                matches.append(f"{rel}:{body[:m.start()].count(chr(10)) + 1}")
        test_part = text if in_tests else "".join(text.split("#[cfg(test)]")[1:])
        sleeps += [rel for _ in re.finditer(r"(thread|tokio::time|time)::sleep\(", test_part)]
    fns.sort(reverse=True)
    out = {
        "longest_functions": [{"lines": l, "at": w} for l, w in fns[: a.top]],
        "functions_over_150_lines": sum(1 for l, _ in fns if l > 150),
        "files_over_1500_lines": [{"lines": n, "file": f} for n, f in sorted(big, reverse=True)],
        "match_on_request": matches,
        "sleeps_in_tests": len(sleeps),
    }
    if a.json:
        json.dump(out, sys.stdout, indent=1)
        print()
        return
    print(f"longest functions (of {len(fns)}; {out['functions_over_150_lines']} over 150 lines):")
    for l, w in fns[: a.top]:
        print(f"  {l:5} {w}")
    print("files over 1,500 lines (up to their #[cfg(test)]):")
    for n, f in sorted(big, reverse=True):
        print(f"  {n:5} {f}")
    print(f"match sites on Request outside tests: {len(matches)}")
    for m in matches:
        print(f"  {m}")
    print(f"sleep calls in tests: {len(sleeps)}")


if __name__ == "__main__":
    main()
