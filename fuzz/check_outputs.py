#!/usr/bin/env python3
"""CPython's half of fuzz_generate's property: every module patchgen generated while fuzzing
compiles with this interpreter, wherever its upstream module does (patchgen indexes with
tree-sitter, which accepts a little more than CPython; an upstream CPython rejects is out of scope).

  fuzz/check_outputs.py DIR    DIR holds <key>.upstream.py and <key>.out.py pairs (PATCHGEN_FUZZ_DUMP)
"""

import os
import sys
import warnings


def compiles(path):
    with open(path, "rb") as f:
        source = f.read()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(source, path, "exec", dont_inherit=True)
        return None
    except (SyntaxError, ValueError) as e:  # ValueError: a NUL byte in the source
        return f"{type(e).__name__}: {e}"


def main():
    folder = sys.argv[1]
    outputs = sorted(n for n in os.listdir(folder) if n.endswith(".out.py"))
    checked = skipped = 0
    failed = []
    for name in outputs:
        key = name[: -len(".out.py")]
        if compiles(os.path.join(folder, key + ".upstream.py")) is not None:
            skipped += 1
            continue
        checked += 1
        why = compiles(os.path.join(folder, name))
        if why is not None:
            failed.append((name, why))
    print(
        f"fuzz: CPython compiled {checked - len(failed)} of {checked} generated modules "
        f"({skipped} left out: their upstream does not compile with CPython)"
    )
    for name, why in failed[:20]:
        print(f"fuzz: {os.path.join(folder, name)}: {why}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
