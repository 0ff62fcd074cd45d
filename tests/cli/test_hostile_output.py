"""Hostile and broken input (issue #17), part 2: --json on bytes that are not UTF-8, --jobs 0, and
the write guarantees (errors name the real output, no temporary file left, file mode kept, no write
through a symbolic link out of the output root). Each test failed before its fix.
"""

import json
import os
import resource
import stat
import subprocess

import pytest

SPEC = "specs/tiny/tiny.yaml"
PY = "generated/tiny/patched_modeling_tiny.py"
DIFF = "generated/tiny/patched_modeling_tiny.diff"


def run(project, *args, preexec_fn=None):
    env = {k: v for k, v in os.environ.items() if k != "PATCHGEN_SOURCE_PATH"}
    env["PATH"] = "/usr/bin:/bin"
    return subprocess.run(
        [project.binary, *args], cwd=project.root, env=env, capture_output=True, timeout=60, preexec_fn=preexec_fn
    )


def temp_files(project):
    return [os.path.join(d, n) for d, _, files in os.walk(project.root) for n in files if ".tmp." in n]


def test_json_report_is_valid_utf8_json_when_a_message_holds_other_bytes(project):
    # A spec file name that is not UTF-8 and a spec that fails to load: the error's path holds the
    # bytes. (A string inside a spec that is not UTF-8 is refused without quoting it.)
    text = project.read(SPEC).replace("upstream: tinypkg.models.tiny.modeling_tiny", "upstream: tinypkg.nowhere")
    os.remove(project.path(SPEC))
    bad = os.path.join(os.path.dirname(project.path(SPEC)).encode(), b"tiny\xff\xfe.yaml")
    with open(bad, "wb") as f:
        f.write(text.encode())
    r = run(project, "--all", "--json")
    assert r.returncode in (3, 4), r.stderr
    report = json.loads(r.stdout.decode("utf-8"))  # strict UTF-8: raises on a stray byte
    (entry,) = report["specs"]
    (error,) = entry["errors"]
    assert error["message"] == "upstream module 'tinypkg.nowhere' not found"
    assert error["path"] == entry["spec"] == "specs/tiny/tiny\ufffd\ufffd.yaml"


def test_spec_string_that_is_not_utf8_is_a_located_error(project):
    spec = (
        project.read(SPEC)
        .encode()
        .replace(b"upstream: tinypkg.models.tiny.modeling_tiny", b"upstream: tinypkg.models.tiny.modeling_\xff\xfe")
    )
    with open(project.path(SPEC), "wb") as f:
        f.write(spec)
    r = run(project, "--all", "--json")
    assert r.returncode in (3, 4), r.stderr
    report = json.loads(r.stdout.decode("utf-8"))
    (entry,) = report["specs"]
    (error,) = entry["errors"]
    assert error["message"] == "this string is not valid UTF-8"
    assert (error["line"], error["col"]) == (2, 40)


def test_index_json_is_valid_for_a_file_name_that_is_not_utf8(project):
    path = os.path.join(project.root.encode(), b"m\xff.py")
    with open(path, "wb") as f:
        f.write(b"def f():\n    pass\n")
    r = run(project, "index", "--json", b"m\xff.py")
    assert r.returncode == 0, r.stderr  # was: terminate called after nlohmann's type_error 316
    index = json.loads(r.stdout.decode("utf-8"))
    assert index["path"] == "m\ufffd.py"
    assert [d["qualname"] for d in index["definitions"]] == ["f"]


@pytest.mark.parametrize("value", ["0", "-3", "abc", "99999999999"])
def test_jobs_out_of_range_says_the_range(project, value):
    r = run(project, "--all", "--jobs", value)
    assert r.returncode == 2
    assert r.stderr.decode() == (
        f"--jobs: takes a number of worker threads from 1 to 1024, not '{value}' (leave --jobs out to use "
        "every core this process may use)\nRun with --help for more information.\n"
    )


def test_failing_write_names_the_output_and_leaves_no_temporary_file(project):
    def small_files():  # ulimit -f: writes past 100 bytes fail (SIGXFSZ used to kill patchgen)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))

    r = run(project, "--all", "--diff", preexec_fn=small_files)
    assert r.returncode == 5, r
    assert r.stderr.decode() == f"{PY}: error: cannot write: File too large\n"
    assert temp_files(project) == []
    assert not os.path.exists(project.path(PY))


def test_existing_output_keeps_its_file_mode(project):
    assert run(project, "--all").returncode == 0
    os.chmod(project.path(PY), 0o640)
    project.write(SPEC, project.read(SPEC).replace("Tiny model with", "The tiny model with"))
    r = run(project, "--all")
    assert r.returncode == 0, r.stderr
    assert b"wrote " + PY.encode() in r.stdout
    assert stat.S_IMODE(os.stat(project.path(PY)).st_mode) == 0o640


def test_output_that_is_a_symbolic_link_is_refused(project, tmp_path):
    target = tmp_path / "elsewhere.py"
    target.write_text("precious = 1\n")
    os.makedirs(project.path("generated/tiny"))
    os.symlink(target, project.path(PY))
    r = run(project, "--all")
    assert r.returncode == 5
    assert r.stderr.decode() == (
        f"{PY}: error: the output is a symbolic link; patchgen writes only regular files and never "
        "writes through a link (remove the link)\n"
    )
    assert target.read_text() == "precious = 1\n"
    assert os.path.islink(project.path(PY))


def test_output_folder_linked_out_of_the_output_root_is_refused(project, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    os.makedirs(project.path("generated"))
    os.symlink(outside, project.path("generated/tiny"))
    r = run(project, "--all", "--diff")
    assert r.returncode == 5
    assert r.stderr.decode() == (
        f"{PY}: error: the output folder leads out of the output root through a symbolic link (to "
        f"'{outside}'); patchgen never writes through a link out of the output root\n"
    )
    assert list(outside.iterdir()) == []


def test_output_folder_linked_inside_the_output_root_is_written(project):
    os.makedirs(project.path("generated/real"))
    os.symlink("real", project.path("generated/tiny"))
    r = run(project, "--all")
    assert r.returncode == 0, r.stderr
    assert os.path.isfile(project.path("generated/real/patched_modeling_tiny.py"))
