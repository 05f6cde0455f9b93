#!/usr/bin/env python3
"""The longest function definitions in C++ sources, and a limit on their length.

Usage: longest_functions.py [--limit N] [--top N] [DIR ...]   (default DIR: launcher)

Prints the --top longest definitions as "LINES  file:line  name" (LINES counts from the
line where the definition's head starts to its closing brace) and exits 1 when one is
longer than --limit (default 150), naming each. A definition is a brace group at
namespace, class or file scope whose head has a parameter list and no "=" before it
(a lambda assigned at namespace scope counts); a lambda inside a function counts as part
of that function. Comments, string, character and raw string literals and preprocessor
lines are skipped, so braces in them are not counted. Standard library only.
"""
import argparse
import os
import re
import sys

SUFFIXES = (".cpp", ".cc", ".hpp", ".h")
CONTAINER = re.compile(r"(^|[\s:>])(namespace|class|struct|union|enum)\b|^extern\b")


def blank_out(text):
    """The text with comments, literals and preprocessor lines replaced by spaces
    (newlines kept, so line numbers stay right)."""
    out = list(text)
    n = len(text)
    i = 0
    line_start = True

    def clear(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if line_start and c == "#":
            j = i
            while j < n:
                if text[j] == "\n" and text[j - 1] != "\\":
                    break
                j += 1
            clear(i, j)
            i = j
            continue
        if c == "\n":
            line_start = True
            i += 1
            continue
        if c in " \t":
            i += 1
            continue
        line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            clear(i, j)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            clear(i, j)
            i = j
        elif c == '"' and i > 0 and text[i - 1] == "R" and not (
                i > 1 and (text[i - 2].isalnum() and text[i - 2] not in "uUL8" or text[i - 2] == "_")):
            m = re.compile(r'"([^(\s]*)\(').match(text, i)
            end = text.find(")" + m.group(1) + '"', m.end()) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            clear(i, j)
            i = j
        elif c == '"' or (c == "'" and not is_digit_separator(text, i)):
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            clear(i, j + 1)
            i = j + 1
        else:
            i += 1
    return "".join(out)


def is_digit_separator(text, i):
    j = i
    while j > 0 and (text[j - 1].isalnum() or text[j - 1] in "_'."):
        j -= 1
    return j < i and text[j].isdigit()


def head_is_function(head):
    head = re.sub(r"\boperator\s*(\(\)|[^\s(]+)", "operator", head)
    paren = head.find("(")
    if paren < 0:
        return False
    eq = head.find("=", 0, paren)
    return eq < 0 or head[eq + 1:].lstrip().startswith("[")


def function_name(head):
    head = re.sub(r"\s+", " ", head)
    m = re.search(r"(~?[\w:]+(?:<[^()]*>)?|operator\s*\S+?)\s*\(", head)
    if "=" in head.split("(")[0]:
        m2 = re.search(r"([\w:]+)\s*=\s*\[", head)
        if m2:
            return m2.group(1) + " (lambda)"
    return m.group(1) if m else head.strip()[:40]


def definitions(path):
    """(first line, last line, name) of each function definition in the file."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = blank_out(f.read())
    found = []
    n = len(text)
    i = 0
    head_start = None  # offset of the current declaration's first token
    first_brace = None  # offset of its first brace group
    parens = 0  # open parentheses in the head: a brace there ("T x = {}") is an argument's
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
            continue
        if c == "}" or c == ";":  # a scope or a declaration ends
            head_start = first_brace = None
            parens = 0
            i += 1
            continue
        if head_start is None:
            head_start = i
        if c == ":" and text[head_start:i].strip() in ("public", "private", "protected"):
            head_start = None  # an access specifier, not part of what follows
            i += 1
            continue
        if c in "()":
            parens += 1 if c == "(" else -1
        if c != "{":
            i += 1
            continue
        if parens > 0:
            i = matching_brace(text, i) + 1
            continue
        head = text[head_start:i] if first_brace is None else text[head_start:first_brace]
        if first_brace is None and CONTAINER.search(head.strip()) and "(" not in head:
            head_start = None  # descend into a namespace, class or extern "C" block
            i += 1
            continue
        if first_brace is None:
            first_brace = i
        j = matching_brace(text, i)
        k = j + 1
        while k < n and text[k].isspace():
            k += 1
        if k < n and text[k] in ",{":  # a constructor's initializer list goes on
            i = k
            continue
        if head_is_function(head):
            first = text.count("\n", 0, head_start) + 1
            last = text.count("\n", 0, j) + 1
            found.append((first, last, function_name(head)))
        head_start = first_brace = None
        parens = 0
        i = j + 1
    return found


def matching_brace(text, i):
    """The offset of the "}" that closes the "{" at offset i (the end of text if none)."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=150)
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("dirs", nargs="*", default=["launcher"])
    args = parser.parse_args()
    rows = []
    for top in args.dirs:
        for root, _, files in os.walk(top):
            for name in sorted(files):
                if name.endswith(SUFFIXES):
                    path = os.path.join(root, name)
                    for first, last, fn in definitions(path):
                        rows.append((last - first + 1, f"{path}:{first}", fn))
    if not rows:
        print(f"longest_functions: no function definitions under {' '.join(args.dirs)}")
        return 2
    rows.sort(key=lambda r: (-r[0], r[1]))
    for lines, where, fn in rows[:args.top]:
        print(f"{lines:5d}  {where}  {fn}")
    over = [r for r in rows if r[0] > args.limit]
    for lines, where, fn in over:
        print(f"longest_functions: {where} {fn} is {lines} lines, over the limit of "
              f"{args.limit}; split it into functions of one concern each")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
