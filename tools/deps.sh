#!/usr/bin/env bash
# Install the Debian packages the build and the tests need, if any are missing.
# Sourced by tools/demo.sh and tools/test.sh. Needs root (or sudo) only when something is missing.
coll_install_deps() {
    local pkgs=(gcc make cmake pkg-config libyaml-dev libzmq3-dev libsodium-dev libcmocka-dev libmicrohttpd-dev "$@")
    local missing=()
    for p in "${pkgs[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "installing: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}
