"""scripts/setup-venv.sh refuses to start a new .venv on a filesystem without room for it, before
pip runs out of space halfway (a clean clone's .venv is about 5 GiB: torch 2.11's CUDA wheels)."""

import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_new_venv_without_room_is_refused_before_pip(tmp_path):
    venv = tmp_path / "venv"
    env = dict(os.environ, VENV=str(venv), SETUP_VENV_NEED_GIB="1000000")
    r = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "setup-venv.sh")], env=env, capture_output=True, text=True
    )
    assert r.returncode == 2
    assert r.stdout == ""
    assert re.fullmatch(
        r"setup-venv: \d+ GiB free under "
        + re.escape(str(tmp_path))
        + r"; a new \.venv needs about 1000000 GiB \(torch 2\.11's CUDA wheels\)\. Free some space, "
        r"or set VENV=/a/roomier/path \(SETUP_VENV_NEED_GIB=N changes the threshold\)\.\n",
        r.stderr,
    )
    assert not venv.exists()
