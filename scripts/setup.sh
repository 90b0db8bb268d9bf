#!/usr/bin/env bash
# Install hpc-cluster into ./.venv (created if missing). Usage: scripts/setup.sh [EXTRAS]
# Works on a fresh Debian as root: installs python3-venv when the interpreter lacks venv.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
py="${PYTHON:-python3}"
export DEBIAN_FRONTEND=noninteractive

apt_install() {
    if [ "$(id -u)" != 0 ]; then
        echo "setup: need '$*' from apt; run as root or install them first" >&2
        exit 1
    fi
    echo "setup: apt-get install $*"
    apt-get update -qq </dev/null
    apt-get install -y -qq --no-install-recommends "$@" </dev/null >/dev/null
}

command -v "$py" >/dev/null 2>&1 || apt_install python3 python3-venv python3-pip
if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv with $("$py" --version 2>&1)"
    if ! "$py" -m venv .venv >/dev/null 2>&1; then
        rm -rf .venv
        ver=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
        apt_install "python${ver}-venv" || apt_install python3-venv
        "$py" -m venv .venv
    fi
fi
spec="."
[ -n "$extras" ] && spec=".[${extras}]"
echo "setup: pip install -e '${spec}' into .venv"
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip </dev/null
.venv/bin/python -m pip install -q --disable-pip-version-check -e "${spec}" </dev/null
if [[ ",${extras}," == *",test,"* ]]; then
    # The example third-party adapter (an entry point of its own): the suite tests the plugin
    # mechanism through it (examples/hpc-cluster-fakebatch/tests).
    echo "setup: pip install -e examples/hpc-cluster-fakebatch into .venv"
    .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -e examples/hpc-cluster-fakebatch </dev/null
fi
