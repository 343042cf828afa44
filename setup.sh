#!/usr/bin/env bash
# One-time set-up on a fresh machine: a Vulkan driver if there is none (lavapipe, Mesa's software Vulkan, on
# Debian/Ubuntu), and the default model (SmolLM2-135M-Instruct, GGUF Q4_1) in models/; with --test also the real
# files the tests use. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")"

have_vulkan() {
    ls /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json >/dev/null 2>&1
}

if [ "$(uname -s)" = Linux ] && ! have_vulkan; then
    if command -v apt-get >/dev/null 2>&1; then
        sudo=""
        [ "$(id -u)" -eq 0 ] || sudo="sudo"
        echo "setup: no Vulkan driver found; installing lavapipe (mesa-vulkan-drivers)"
        export DEBIAN_FRONTEND=noninteractive
        $sudo apt-get update -qq
        $sudo apt-get install -y -qq mesa-vulkan-drivers >/dev/null
    else
        echo "setup: no Vulkan driver found; install your GPU's Vulkan driver or Mesa's lavapipe" >&2
    fi
fi

# --test: the tests also run on OpenGL (Mesa's llvmpipe through EGL, headless).
if [ "${1:-}" = "--test" ] && [ "$(uname -s)" = Linux ] && command -v apt-get >/dev/null 2>&1 \
    && ! ldconfig -p 2>/dev/null | grep -q libEGL_mesa; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "setup: installing Mesa's OpenGL (libegl-mesa0, libgl1-mesa-dri) for the GL tests"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq libegl1 libegl-mesa0 libgl1-mesa-dri >/dev/null
fi

bash models/fetch.sh
# --test: also the real published files the tests check (Qwen2.5-Coder-0.5B and 1.5B, Gemma 3 270M; Q4_K_M GGUFs),
# and the official OpenAI Python client that tests/openai_client.py drives `shaderlm serve` with.
if [ "${1:-}" = "--test" ]; then
    bash models/fetch.sh qwen2.5-coder-0.5b
    bash models/fetch.sh qwen2.5-coder-1.5b
    bash models/fetch.sh gemma3-270m
    python3 -m pip install --quiet --disable-pip-version-check "openai==3.57.0" || {
        echo "setup: could not pip-install openai==3.57.0, which tests/openai_client.py needs; install it into" \
            "the python3 that runs the tests (a virtual environment works)" >&2
        exit 1
    }
fi
