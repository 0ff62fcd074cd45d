"""scripts/check_kernel_registers.py and kernels/cmake/ptxas_report.sh: ptxas's resource reports read
per entry function, budgets applied by demangled name, unbudgeted spills refused. On written
reports and a stub compiler; the kernel_registers test runs the checker on the real build."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_kernel_registers.py"
LAUNCHER = ROOT / "kernels" / "cmake" / "ptxas_report.sh"
_spec = importlib.util.spec_from_file_location("check_kernel_registers", SCRIPT)
regs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(regs)

# Mangled names of opslot::(anonymous namespace)::collapse_fwd_pipe_kernel<__nv_bfloat16, 4, 8, 1, 512>
# and opslot::topk::(anonymous namespace)::topk_kernel<0, 512, 1, 0>, as nvcc 13 named them.
COLLAPSE = "_ZN6opslot38_GLOBAL__N__0f24f9a0_6_mhc_cu_09247c8624collapse_fwd_pipe_kernelI13__nv_bfloat16Li4ELi8ELi1ELi512EEEvlPKT_PKfilS7_S7_ffPS3_PfS9_li"
TOPK = "_ZN6opslot4topk39_GLOBAL__N__24a7ea93_7_topk_cu_84f3a5f211topk_kernelILi0ELi512ELi1ELi0EEEvNS1_6ParamsE"
HELPER = "_ZN6opslot6helperEv"


def report(entries):
    """A ptxas -v report: (mangled, target, registers, spill bytes) per entry function, a device
    function's properties between them."""
    lines = ["ptxas info    : 0 bytes gmem"]
    for mangled, target, registers, spills in entries:
        lines += [
            f"ptxas info    : Compiling entry function '{mangled}' for '{target}'",
            f"ptxas info    : Function properties for {HELPER}",
            "    8 bytes stack frame, 999 bytes spill stores, 999 bytes spill loads",
            f"ptxas info    : Function properties for {mangled}",
            f"    {spills} bytes stack frame, {spills} bytes spill stores, {spills} bytes spill loads",
            f"ptxas info    : Used {registers} registers, used 1 barriers, 384 bytes cmem[0]",
            "ptxas info    : Compile time = 5.494 ms",
        ]
    return "\n".join(lines) + "\n"


def run(tmp_path, entries, budget):
    objs = tmp_path / "objs"
    objs.mkdir(exist_ok=True)
    (objs / "mhc.cu.o.ptxas").write_text(report(entries))
    (tmp_path / "budget.txt").write_text(budget)
    out = subprocess.run(
        [sys.executable, SCRIPT, objs, "--budget", tmp_path / "budget.txt"], capture_output=True, text=True
    )
    return out.returncode, out.stdout.splitlines()


def test_names_are_demangled_without_return_type_parameters_or_anonymous_namespaces():
    functions = regs.parse_report(report([(COLLAPSE, "sm_90a", 64, 0), (TOPK, "sm_80", 64, 296)]), "x")
    regs.demangle(functions, "c++filt")
    assert [(f.name, f.target, f.registers, f.spills) for f in functions] == [
        ("opslot::collapse_fwd_pipe_kernel<__nv_bfloat16, 4, 8, 1, 512>", "sm_90a", 64, 0),
        ("opslot::topk::topk_kernel<0, 512, 1, 0>", "sm_80", 64, 296),
    ]
    assert regs.short_name("void opslot::k<float (*)(int)>(float (*)(int), int)") == "opslot::k<float (*)(int)>"


def test_within_budget_passes(tmp_path):
    rc, out = run(
        tmp_path,
        [(COLLAPSE, "sm_90a", 64, 0), (TOPK, "sm_90a", 64, 136)],
        "# comment\nsm_90a 64 0 opslot::collapse_fwd_pipe_kernel<*, 1, 512>\n"
        "sm_90a 64 136 opslot::topk::topk_kernel<*, 512, 1, 0>\n",
    )
    assert (rc, out) == (0, ["check_kernel_registers: 2 kernels in 1 reports, 2 budget lines, 1 kernels spill; ok"])


def test_a_register_or_spill_over_budget_fails_with_the_line_and_kernel(tmp_path):
    rc, out = run(
        tmp_path,
        [(COLLAPSE, "sm_90a", 75, 0), (TOPK, "sm_90a", 64, 140)],
        "sm_90a 64 0 opslot::collapse_fwd_pipe_kernel<*, 1, 512>\nsm_90a 64 136 opslot::topk::topk_kernel<*>\n",
    )
    assert rc == 1
    assert out == [
        "budget.txt:1: opslot::collapse_fwd_pipe_kernel<__nv_bfloat16, 4, 8, 1, 512> [sm_90a] uses 75 "
        "registers, the budget is 64",
        "budget.txt:2: opslot::topk::topk_kernel<0, 512, 1, 0> [sm_90a] spills 140 bytes, the budget is 136",
        "check_kernel_registers: 2 kernels in 1 reports, 2 budget lines, 1 kernels spill; 2 violations",
    ]


def test_an_unbudgeted_spill_and_a_line_matching_nothing_fail(tmp_path):
    rc, out = run(
        tmp_path,
        [(COLLAPSE, "sm_90a", 64, 0), (TOPK, "sm_80", 64, 296)],
        "sm_90a 64 0 opslot::collapse_fwd_pipe_kernel<*>\nsm_90a 64 296 opslot::topk::topk_kernel<*>\n",
    )
    assert rc == 1
    assert out == [
        "budget.txt:2: matches no sm_90a kernel: opslot::topk::topk_kernel<*>",
        "opslot::topk::topk_kernel<0, 512, 1, 0> [sm_80] spills 296 bytes and no budget line allows it",
        "check_kernel_registers: 2 kernels in 1 reports, 2 budget lines, 1 kernels spill; 2 violations",
    ]


def test_a_removed_sources_report_is_skipped_and_said_so(tmp_path):
    objs, src = tmp_path / "objs", tmp_path / "src"
    objs.mkdir()
    src.mkdir()
    (src / "mhc.cu").write_text("")
    (objs / "mhc.cu.o.ptxas").write_text(report([(COLLAPSE, "sm_90a", 64, 0)]))
    (objs / "gone.cu.o.ptxas").write_text(report([(TOPK, "sm_90a", 64, 136)]))
    (tmp_path / "budget.txt").write_text("sm_90a 64 0 opslot::collapse_fwd_pipe_kernel<*>\n")
    out = subprocess.run(
        [sys.executable, SCRIPT, objs, "--budget", tmp_path / "budget.txt", "--sources", src],
        capture_output=True,
        text=True,
    )
    assert (out.returncode, out.stdout.splitlines()) == (
        0,
        [
            f"check_kernel_registers: skipped {objs / 'gone.cu.o.ptxas'}: no gone.cu in {src}",
            "check_kernel_registers: 1 kernels in 1 reports, 1 budget lines, 0 kernels spill; ok",
        ],
    )


def test_patterns_treat_only_star_as_special():
    assert regs.glob_regex("a<*, 1, 512>").match("a<float, 4, 4, 1, 512>")
    assert not regs.glob_regex("a<*, 1, 512>").match("a<float, 4, 4, 2, 512>")
    assert not regs.glob_regex("a.b").match("axb")
    assert regs.glob_regex("k[2]").match("k[2]")


@pytest.mark.parametrize(
    "budget, message",
    [
        ("sm_90a 64 opslot::k\n", "b.txt:1: expected '<target> <max registers> <max spill bytes> <pattern>'"),
        ("\n# c\nsm_90a x 0 opslot::k\n", "b.txt:3: expected '<target> <max registers> <max spill bytes> <pattern>'"),
    ],
)
def test_malformed_budget_lines_are_refused_with_their_line(budget, message):
    with pytest.raises(ValueError) as e:
        regs.parse_budget(budget, "b.txt")
    assert str(e.value) == message


def test_missing_reports_and_register_lines_exit_2(tmp_path):
    (tmp_path / "budget.txt").write_text("")
    out = subprocess.run(
        [sys.executable, SCRIPT, tmp_path, "--budget", tmp_path / "budget.txt"], capture_output=True, text=True
    )
    assert (out.returncode, out.stderr) == (2, f"check_kernel_registers: no *.ptxas under {tmp_path}\n")
    (tmp_path / "a.ptxas").write_text(f"ptxas info    : Compiling entry function '{TOPK}' for 'sm_90a'\n")
    out = subprocess.run(
        [sys.executable, SCRIPT, tmp_path, "--budget", tmp_path / "budget.txt"], capture_output=True, text=True
    )
    assert (out.returncode, out.stderr) == (
        2,
        f"check_kernel_registers: {tmp_path / 'a.ptxas'}: an entry function without its 'Used N registers' line\n",
    )


def stub_compiler(tmp_path, stderr_text, rc):
    stub = tmp_path / "nvcc"
    (tmp_path / "stderr.txt").write_text(stderr_text)
    stub.write_text(f"#!/bin/sh\ncat {tmp_path / 'stderr.txt'} >&2\nexit {rc}\n")
    stub.chmod(0o755)
    return stub


def launch(tmp_path, mode, rc):
    text = report([(TOPK, "sm_90a", 64, 0)]) + "warning: something the user must see\n"
    stub = stub_compiler(tmp_path, text, rc)
    obj = tmp_path / "x.o"
    out = subprocess.run(
        [LAUNCHER, mode, stub, "-c", "x.cu", "-o", obj], capture_output=True, text=True, env=dict(os.environ)
    )
    return out, obj, text


def test_launcher_writes_the_report_beside_the_object_and_passes_the_rest_through(tmp_path):
    out, obj, text = launch(tmp_path, "quiet", 0)
    assert out.returncode == 0
    assert out.stderr == "warning: something the user must see\n"
    assert Path(f"{obj}.ptxas").read_text() == "".join(
        line + "\n" for line in text.splitlines() if line.startswith(("ptxas info", "    "))
    )
    out, obj, text = launch(tmp_path, "print", 0)
    assert (out.returncode, out.stderr) == (0, text)


def test_launcher_keeps_the_compilers_failure_and_writes_no_report(tmp_path):
    out, obj, _ = launch(tmp_path, "quiet", 3)
    assert out.returncode == 3
    assert out.stderr == "warning: something the user must see\n"
    assert not Path(f"{obj}.ptxas").exists()
