#!/usr/bin/env bash
# The system programs the tests drive: headless Chromium (the HTML reports and JupyterLab are
# opened in it) and tmux (the terminal monitor is captured in it at 80x24 and 120x40).
# Installs the Debian packages `chromium` and `tmux` when missing; needs root (or sudo).
set -euo pipefail

missing=()
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || missing+=(chromium)
command -v tmux >/dev/null 2>&1 || missing+=(tmux)

if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        if ! command -v sudo >/dev/null 2>&1; then
            echo "ci_install_system: need root or sudo to apt-get install ${missing[*]}" >&2
            exit 1
        fi
        SUDO="sudo"
    fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update
    $SUDO apt-get install -y "${missing[@]}"
fi
echo "chromium: $(command -v chromium || command -v chromium-browser)"
echo "tmux: $(command -v tmux)"
