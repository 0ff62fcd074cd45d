"""Hostile input, round 2 (issue #28), the generator side: thousands of undefined names on one
very long inserted line. Each diagnostic copied the whole line (the spec's, and the output's for
its "generated line" note), and each location split the whole spec into lines: 10,000 unknown
names on one 110 KB line took 4.3 GB and 6 s. Now a location keeps only what its excerpt shows,
a note quotes the window around the column, and at most 20 undefined names are reported, the
20th with "... and K more".
"""

import os
import resource
import subprocess
import tempfile
import threading

SPEC = "specs/tiny/tiny.yaml"
NAMES = 10_000
MAX_RSS_MIB = 200
TIME_LIMIT_S = 60
WINDOW = 200  # code points an excerpt shows of a long line


def measured(project, *args):
    """(returncode, stdout, stderr, peak RSS of the child in MiB), with a time limit."""
    env = {k: v for k, v in os.environ.items() if k != "PATCHGEN_SOURCE_PATH"}
    env["PATH"] = "/usr/bin:/bin"
    with open(project.binary, "rb") as f:
        asan = b"__asan_init" in f.read()

    def limit():
        if not asan:
            resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(
            [project.binary, *args], cwd=project.root, env=env, stdout=out, stderr=err, preexec_fn=limit
        )
        timer = threading.Timer(TIME_LIMIT_S, p.kill)
        timer.start()
        _, status, usage = os.wait4(p.pid, 0)
        timer.cancel()
        out.seek(0)
        err.seek(0)
        return (os.waitstatus_to_exitcode(status), out.read().decode(), err.read().decode(), usage.ru_maxrss // 1024)


def names_line(n):
    return "x = [" + ", ".join(f"name{i:05d}" for i in range(n)) + "]"


def test_ten_thousand_undefined_names_on_one_line_take_bounded_memory_and_output(project):
    line = names_line(NAMES)
    assert len(line) > 100_000
    project.write(SPEC, project.read(SPEC) + f"blocks:\n  - |\n    {line}\n")
    rc, out, err, rss = measured(project, SPEC, "-o", "out")
    assert rc == 3
    assert rss < MAX_RSS_MIB, rss  # was: 4.3 GB
    assert err.count(": error: undefined name") == 20
    assert len(err) < 20_000, len(err)  # was: 14 MB
    spec_line = "    " + line
    first = err.split("\n")[:5]
    assert first == [
        "specs/tiny/tiny.yaml:21:10: error: undefined name 'name00000' in inserted code",
        "   21 | " + spec_line[:WINDOW] + "...",
        "      |          ^~~~~~~~~",
        "note: generated line 24: " + line[:WINDOW] + "...",
        "help: import it with `imports.add`, define it in `helpers:`, or map it with `name_map`",
    ]
    last = err.split("specs/tiny/tiny.yaml:21:")[-1].split("\n")
    # name00019 starts at column 10 + 19 * 11 = 219 (code point 218): the window starts 50 code
    # points before it; in the output the line is not indented (code point 214).
    assert last[0] == "219: error: undefined name 'name00019' in inserted code"
    assert last[1] == "   21 | ..." + spec_line[218 - 50 : 218 - 50 + WINDOW] + "..."
    assert last[2] == "      |    " + " " * 50 + "^~~~~~~~~"
    assert last[3] == ("note: generated line 24: ..." + line[214 - 50 : 214 - 50 + WINDOW] + "...")
    assert last[4] == "note: ... and 9980 more undefined names in inserted code"
    assert last[5].startswith("help: ")
    assert out == "1 specs: 0 written, 0 unchanged, 0 skipped, 1 failed\n"


def test_a_long_line_with_a_few_undefined_names_reports_each_with_its_window(project):
    # Non-ASCII text before the names: windows are cut at code points, carets stay aligned.
    line = "x = ['" + "é" * 300 + "', alpha, " + "0, " * 100 + "beta]"
    project.write(SPEC, project.read(SPEC) + f"blocks:\n  - |\n    {line}\n")
    rc, out, err, rss = measured(project, SPEC, "-o", "out")
    assert rc == 3
    lines = err.split("\n")
    alpha = 4 + line.index("alpha")  # 0-based code point of the spec line
    assert lines[0] == f"specs/tiny/tiny.yaml:21:{alpha + 1}: error: undefined name 'alpha' in inserted code"
    spec_line = "    " + line
    assert lines[1] == "   21 | ..." + spec_line[alpha - 50 : alpha + 150] + "..."
    assert lines[2] == "      |    " + " " * 50 + "^~~~~"
    at = line.index("alpha")  # the output's line is not indented
    assert lines[3] == "note: generated line 24: ..." + line[at - 50 : at + 150] + "..."
    beta = 4 + line.index("beta")
    assert f"specs/tiny/tiny.yaml:21:{beta + 1}: error: undefined name 'beta' in inserted code" in err
    assert "... and" not in err
    assert err.encode("utf-8").decode("utf-8") == err
