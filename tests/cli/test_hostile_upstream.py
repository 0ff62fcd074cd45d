"""Hostile and broken input (issue #17), part 3: upstream modules with a byte order mark, CRLF or CR
line endings or tab indentation, and specs with a byte order mark. Each case either generates a file
CPython compiles or is refused with a located error; each test failed before its fix.
"""

import os
import re
import subprocess

SPEC = "specs/tiny/tiny.yaml"
UPSTREAM = "upstream/tinypkg/models/tiny/modeling_tiny.py"
PY = "generated/tiny/patched_modeling_tiny.py"


def run(project, *args):
    env = {k: v for k, v in os.environ.items() if k != "PATCHGEN_SOURCE_PATH"}
    env["PATH"] = "/usr/bin:/bin"
    return subprocess.run(
        [project.binary, *args], cwd=project.root, env=env, capture_output=True, text=True, timeout=60
    )


def read_bytes(project, rel):
    with open(project.path(rel), "rb") as f:
        return f.read()


def write_bytes(project, rel, data):
    with open(project.path(rel), "wb") as f:
        f.write(data)


def compiles(data):
    compile(data, "generated.py", "exec", dont_inherit=True)  # raises SyntaxError / TabError


def test_upstream_with_a_byte_order_mark_generates_a_module_cpython_compiles(project):
    plain = read_bytes(project, UPSTREAM)
    assert run(project, "--all").returncode == 0
    expected = read_bytes(project, PY)
    write_bytes(project, UPSTREAM, b"\xef\xbb\xbf" + plain)
    r = run(project, "--all", "--diff")
    assert r.returncode == 0, r.stderr
    out = read_bytes(project, PY)
    compiles(out)  # was: SyntaxError: invalid non-printable character U+FEFF (after the header)
    assert b"\xef\xbb\xbf" not in out

    # Same module as without the mark, except the upstream's sha256 in the header.
    def strip(b):
        return re.sub(rb"sha256[^\n]*", b"", b)

    assert strip(out) == strip(expected)
    diff = read_bytes(project, "generated/tiny/patched_modeling_tiny.diff")
    assert b"-\xef\xbb\xbf" in diff  # the diff shows the mark removed


def test_upstream_with_crlf_line_endings_gets_crlf_throughout(project):
    plain = read_bytes(project, UPSTREAM)
    write_bytes(project, UPSTREAM, plain.replace(b"\n", b"\r\n"))
    r = run(project, "--all")
    assert r.returncode == 0, r.stderr
    out = read_bytes(project, PY)
    compiles(out)
    assert out.count(b"\n") == out.count(b"\r\n")  # was: CRLF upstream lines mixed with LF ones


def test_upstream_with_cr_line_endings_is_refused(project):
    plain = read_bytes(project, UPSTREAM)
    write_bytes(project, UPSTREAM, plain.replace(b"\n", b"\r"))
    r = run(project, "--all")
    assert r.returncode == 4
    first = plain.split(b"\n")[0].decode()
    assert r.stderr.startswith(
        f"{UPSTREAM}:1:{len(first) + 1}: error: upstream module has a CR line ending ('\\r' without '\\n')\n"
    )
    assert r.stderr.endswith(
        "help: patchgen reads modules with LF or CRLF line endings; convert the file (e.g. `dos2unix -c mac`)\n"
    )
    assert not os.path.exists(project.path(PY))


def test_upstream_indented_with_tabs_is_refused(project):
    lines = read_bytes(project, UPSTREAM).decode().split("\n")
    tabbed = [re.sub(r"^((?:    )+)", lambda m: "\t" * (len(m.group(1)) // 4), line) for line in lines]
    write_bytes(project, UPSTREAM, "\n".join(tabbed).encode())
    r = run(project, "--all")
    assert r.returncode == 4  # was: exit 0 and a module CPython rejects (IndentationError)
    n = next(i for i, line in enumerate(tabbed) if line.startswith("\t")) + 1
    assert r.stderr == (
        f"{UPSTREAM}:{n}:1: error: upstream module is indented with tabs\n"
        f"{n:>5} | {tabbed[n - 1]}\n"
        "      | ^\n"
        "help: code patchgen inserts is indented with spaces, and CPython rejects a block that mixes tabs "
        "and spaces; convert the module's indentation to spaces (e.g. `expand -i -t 8`)\n"
    )
    assert not os.path.exists(project.path(PY))


def test_tabs_inside_a_string_or_comment_are_not_indentation(project):
    plain = read_bytes(project, UPSTREAM)
    write_bytes(project, UPSTREAM, plain + b'\nTEXT = """\n\tindented text\n"""\n\t# a comment\n')
    r = run(project, "--all")
    assert r.returncode == 0, r.stderr
    compiles(read_bytes(project, PY))


def test_spec_with_a_byte_order_mark_keeps_its_columns(project):
    spec = project.read(SPEC).replace("TinyMLP.forward", "TinyMLP.fowrard")
    write_bytes(project, SPEC, b"\xef\xbb\xbf" + spec.encode())
    r = run(project, "--all")
    assert r.returncode == 3
    # was: "specs/tiny/tiny.yaml:12:12: error: 'call' spans several lines but is not a literal block"
    assert r.stderr.startswith(
        "specs/tiny/tiny.yaml:15:22: error: no method 'fowrard' in class 'TinyMLP'\n"
        "   15 |   - override_method: TinyMLP.fowrard\n"
        "      |                      ^~~~~~~~~~~~~~~\n"
    ), r.stderr


def test_patch_file_with_a_byte_order_mark_is_refused_not_written(project):
    patch = read_bytes(project, "specs/tiny/patches/mlp.py")
    write_bytes(project, "specs/tiny/patches/mlp.py", b"\xef\xbb\xbf" + patch)
    r = run(project, "--all")
    assert r.returncode == 3  # was: exit 0 and a module CPython rejects (U+FEFF before `def forward`)
    assert r.stderr.startswith(
        f"{PY}:46:5: error: the generated module would hold U+FEFF (a byte order mark), which CPython rejects\n"
    ), r.stderr
    assert r.stderr.endswith(
        "help: it comes from the upstream module, a patch file or the spec at that place of the output; "
        "save them as UTF-8 without a byte order mark\n"
    )
    assert not os.path.exists(project.path(PY))


def test_upstream_in_latin1_with_a_coding_cookie_is_refused_not_written(project):
    plain = read_bytes(project, UPSTREAM)
    latin1 = b"# -*- coding: latin-1 -*-\n" + plain + b"NAME = 'caf\xe9'\n"
    compile(latin1, "upstream.py", "exec")  # CPython accepts the upstream itself ...
    write_bytes(project, UPSTREAM, latin1)
    r = run(project, "--all")
    # ... but the generated header pushes the cookie off the first two lines.
    assert r.returncode == 3, r.stderr
    assert (
        "error: the generated module would hold the byte 0xE9, which is not UTF-8, which CPython rejects\n" in r.stderr
    )
    assert not os.path.exists(project.path(PY))
