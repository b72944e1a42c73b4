#!/usr/bin/env bash
# The Dockerfile, built for real with podman (CPU-only): a Debian 12 base image made here
# with debootstrap + podman import, `podman build --isolation=chroot` (podman run needs
# more than these machines allow), then coll-agent --version and --check-config run from
# the built image's filesystem (podman image mount + chroot), and the files an
# application image copies checked. Usage: run.sh SOURCE_DIR (as root; 77 = skipped)
set -uo pipefail
src=$1
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "building the image needs root (podman's storage, debootstrap)"
command -v podman >/dev/null || skip "no podman"
command -v debootstrap >/dev/null || skip "no debootstrap"
tag=localhost/coll-agent-test:$$ base=localhost/coll-base-test:$$
dir=$(mktemp -d /tmp/coll-image-XXXX)
mnt= tmpfs=
cleanup() {
    [ -n "$tmpfs" ] && umount "$mnt/tmp"
    [ -n "$mnt" ] && podman image unmount "$tag" >/dev/null 2>&1
    podman rmi -f "$tag" "$base" >/dev/null 2>&1
    rm -rf "$dir"
}
trap cleanup EXIT
mirror=$(awk '/^deb / && /debian/ {print $2; exit}' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null)
[ -n "$mirror" ] || mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)
[ -n "$mirror" ] || mirror=http://deb.debian.org/debian
t0=$(date +%s)
debootstrap --variant=minbase bookworm "$dir/root" "$mirror" >"$dir/debootstrap.log" 2>&1 ||
    skip "debootstrap could not fetch Debian 12 from $mirror (no network?): $(tail -1 "$dir/debootstrap.log")"
tar -C "$dir/root" -c . | podman import - "$base" >/dev/null || { echo "podman import failed"; exit 1; }
t1=$(date +%s)
echo "base image from debootstrap: $((t1 - t0)) s"
podman build --isolation=chroot --build-arg WITH_CUDA=OFF --build-arg BUILD_IMAGE="$base" \
    --build-arg RUNTIME_IMAGE="$base" -t "$tag" "$src" >"$dir/build.log" 2>&1 ||
    { tail -30 "$dir/build.log"; echo "podman build failed"; exit 1; }
echo "image built in $(($(date +%s) - t1)) s"
mnt=$(podman image mount "$tag") || { echo "podman image mount failed"; exit 1; }
for f in usr/local/bin/coll-agent usr/local/bin/coll-demo usr/local/bin/coll-bench \
    usr/local/include/coll/coll.h usr/local/lib/pkgconfig/coll.pc \
    usr/local/lib/cmake/coll/collConfig.cmake usr/local/lib/python3/dist-packages/coll/__init__.py; do
    [ -e "$mnt/$f" ] || { echo "missing from the image: /$f"; exit 1; }
done
ls "$mnt"/usr/local/lib/libcoll.so* >/dev/null || { echo "no libcoll in the image"; exit 1; }
v=$(chroot "$mnt" /usr/local/bin/coll-agent --version) || { echo "coll-agent --version failed"; exit 1; }
echo "from the image: $v"
# the mounted image is read-only: a tmpfs over its /tmp carries the config in
mount -t tmpfs tmpfs "$mnt/tmp" || { echo "cannot mount a tmpfs in the image"; exit 1; }
tmpfs=1
cat >"$dir/agent.yaml" <<'YAML'
node:
  index: auto
discovery:
  mode: kubernetes
  coordinator: "train-0.train.ns.svc.cluster.local.:7100"
groups:
  - name: g
    members: 4
http:
  port: 8080
YAML
cp "$dir/agent.yaml" "$mnt/tmp/agent.yaml"
out=$(chroot "$mnt" env POD_NAME=train-2 /usr/local/bin/coll-agent --check-config /tmp/agent.yaml) ||
    { echo "--check-config failed in the image: $out"; exit 1; }
echo "$out" | grep -q "# node.index 2, from the ordinal of pod name 'train-2'" ||
    { echo "unexpected --check-config output: $out"; exit 1; }
echo "image test passed"
