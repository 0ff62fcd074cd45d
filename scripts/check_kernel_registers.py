#!/usr/bin/env python3
"""The kernels' registers and spills against kernels/register_budget.txt.

Reads ptxas's resource reports that the kernels' build writes beside each CUDA object
(<object>.ptxas, kernels/cmake/ptxas_report.sh), names each function as c++filt demangles it and
checks two rules:
- a budget line holds: every function it matches (for its target) uses at most its registers and
  spills at most its bytes (stores and loads alike), and it matches at least one function, so that a
  renamed or removed kernel cannot leave a budget that checks nothing;
- no function spills unless a budget line allows it.
Exit 0 when both hold, 1 with one line per violation, 2 on unreadable input. `--table` prints every
function's registers and spills.

Budget lines: `<target> <max registers> <max spill bytes> <pattern>`, the pattern the rest of the
line: a kernel's name as c++filt demangles it, without its return type, parameter list and
`(anonymous namespace)::` (`opslot::topk::topk_kernel<0, 512, 1, 0>`), in which `*` matches any run
of characters (nothing else is special). `#` starts a comment line.
"""

import argparse
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ENTRY = re.compile(r"^ptxas info +: Compiling entry function '([^']+)' for '([^']+)'")
PROPS = re.compile(r"^ptxas info +: Function properties for (\S+)")
SPILLS = re.compile(r"^ +\d+ bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"^ptxas info +: Used (\d+) registers")


@dataclass
class Function:
    mangled: str
    target: str
    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    name: str = ""

    @property
    def spills(self):
        return max(self.spill_stores, self.spill_loads)


@dataclass
class Budget:
    line: int
    target: str
    registers: int
    spills: int
    pattern: str
    regex: re.Pattern


def parse_report(text, source):
    """The entry functions of one ptxas report, in order (device functions' properties are skipped:
    their spills are charged to the entry functions that call them)."""
    functions, current, props_of = [], None, None
    for line in text.splitlines():
        if m := ENTRY.match(line):
            current = Function(m.group(1), m.group(2))
            functions.append(current)
            props_of = None
        elif m := PROPS.match(line):
            props_of = m.group(1)
        elif (m := SPILLS.match(line)) and current and props_of == current.mangled:
            current.spill_stores, current.spill_loads = map(int, m.groups())
        elif (m := USED.match(line)) and current:
            current.registers = int(m.group(1))
    if any(f.registers == 0 for f in functions):
        raise ValueError(f"{source}: an entry function without its 'Used N registers' line")
    return functions


def demangle(functions, cxxfilt):
    if not functions:
        return
    out = subprocess.run(
        [cxxfilt],
        input="\n".join(f.mangled for f in functions) + "\n",
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    if len(out) != len(functions):
        raise ValueError(f"{cxxfilt} gave {len(out)} names for {len(functions)}")
    for f, name in zip(functions, out):
        f.name = short_name(name)


def short_name(demangled):
    """A kernel's demangled name without its return type, parameter list and anonymous namespaces:
    `opslot::topk::topk_kernel<0, 512, 1, 0>`."""
    name = demangled.removeprefix("void ").replace("(anonymous namespace)::", "")
    if name.endswith(")"):
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                return name[:i]
    return name


def glob_regex(pattern):
    return re.compile("^" + ".*".join(re.escape(part) for part in pattern.split("*")) + "$")


def parse_budget(text, source):
    budgets = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.split(None, 3)
        if len(parts) != 4 or not parts[1].isdigit() or not parts[2].isdigit():
            raise ValueError(f"{source}:{number}: expected '<target> <max registers> <max spill bytes> <pattern>'")
        pattern = parts[3].strip()
        budgets.append(Budget(number, parts[0], int(parts[1]), int(parts[2]), pattern, glob_regex(pattern)))
    return budgets


def violations(functions, budgets, budget_name):
    """One message per broken rule, in budget order, then the unbudgeted spills in name order."""
    out, covered = [], set()
    for b in budgets:
        matched = [f for f in functions if f.target == b.target and b.regex.match(f.name)]
        if not matched:
            out.append(f"{budget_name}:{b.line}: matches no {b.target} kernel: {b.pattern}")
        for f in matched:
            covered.add(id(f))
            if f.registers > b.registers:
                out.append(
                    f"{budget_name}:{b.line}: {f.name} [{f.target}] uses {f.registers} registers, "
                    f"the budget is {b.registers}"
                )
            if f.spills > b.spills:
                out.append(
                    f"{budget_name}:{b.line}: {f.name} [{f.target}] spills {f.spills} bytes, the budget is {b.spills}"
                )
    for f in sorted(functions, key=lambda f: (f.name, f.target)):
        if f.spills and id(f) not in covered:
            out.append(f"{f.name} [{f.target}] spills {f.spills} bytes and no budget line allows it")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("objects", type=Path, help="folder searched for *.ptxas (the kernels' build folder)")
    ap.add_argument("--budget", type=Path, required=True)
    ap.add_argument(
        "--sources",
        type=Path,
        help="the kernels' source folder: a report whose <name>.cu is not there (a removed source's, left "
        "in the build folder) is skipped, and said so",
    )
    ap.add_argument("--cxxfilt", default="c++filt")
    ap.add_argument("--table", action="store_true", help="print every function's registers and spills")
    args = ap.parse_args(argv)
    reports = sorted(args.objects.rglob("*.ptxas"))
    if args.sources:
        kept = []
        for r in reports:
            source = r.name.removesuffix(".o.ptxas")
            if (args.sources / source).is_file():
                kept.append(r)
            else:
                print(f"check_kernel_registers: skipped {r}: no {source} in {args.sources}")
        reports = kept
    if not reports:
        print(f"check_kernel_registers: no *.ptxas under {args.objects}", file=sys.stderr)
        return 2
    try:
        functions = [f for r in reports for f in parse_report(r.read_text(), r)]
        demangle(functions, args.cxxfilt)
        budgets = parse_budget(args.budget.read_text(), args.budget.name)
    except (OSError, ValueError, subprocess.CalledProcessError) as e:
        print(f"check_kernel_registers: {e}", file=sys.stderr)
        return 2
    if args.table:
        for f in sorted(functions, key=lambda f: (f.target, f.name)):
            print(f"{f.target}\t{f.registers}\t{f.spills}\t{f.name}")
    problems = violations(functions, budgets, args.budget.name)
    for p in problems:
        print(p)
    spilling = sum(1 for f in functions if f.spills)
    print(
        f"check_kernel_registers: {len(functions)} kernels in {len(reports)} reports, "
        f"{len(budgets)} budget lines, {spilling} kernels spill; "
        + (f"{len(problems)} violations" if problems else "ok")
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
