#!/bin/sh
# cloudtrain host probe: what a node offers, as key=value lines (one `gpu=` line per GPU).
# Runs via `sh -c`, so it must stay POSIX sh and never fail as a whole.
os=$( (. /etc/os-release 2>/dev/null && printf %s "${PRETTY_NAME:-$NAME}") || true)
echo "os=${os:-$(uname -s)}"
echo "kernel=$(uname -sr)"
echo "arch=$(uname -m)"
py=$(command -v python3 2>/dev/null || true)
echo "python3=$py"
if [ -n "$py" ]; then
    echo "python_version=$("$py" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null)"
fi
if command -v rsync >/dev/null 2>&1; then echo "rsync=1"; else echo "rsync=0"; fi
if command -v nvidia-smi >/dev/null 2>&1; then
    echo "nvidia_smi=1"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader,nounits 2>/dev/null |
        sed 's/^/gpu=/'
    echo "cuda=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n 1)"
else
    echo "nvidia_smi=0"
fi
exit 0
