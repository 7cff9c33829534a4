#!/usr/bin/env bash
# Headless Chromium for the report tests (tests/test_reports.py opens the HTML reports in it).
# Installs Debian's `chromium` package when no chromium is on PATH; needs root (or sudo).
set -euo pipefail

if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    echo "chromium: $(command -v chromium || command -v chromium-browser)"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "ci_install_browser: need root or sudo to apt-get install chromium" >&2
        exit 1
    fi
    SUDO="sudo"
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y chromium
echo "chromium: $(command -v chromium)"
