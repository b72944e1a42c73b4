# coll-agent and libcoll as a container image.
#
#   GPU (default): docker build -t coll-agent .
#   CPU only:      docker build --build-arg WITH_CUDA=OFF \
#                    --build-arg BUILD_IMAGE=debian:12 --build-arg RUNTIME_IMAGE=debian:12-slim -t coll-agent:cpu .
#
# The runtime image carries coll-agent, coll-demo, coll-bench (and coll-gpu-bench with
# CUDA), libcoll with its header, pkg-config and CMake files under /usr/local, for
# application images to copy from:
#   COPY --from=coll-agent /usr/local/include/coll /usr/local/include/coll
#   COPY --from=coll-agent /usr/local/lib/libcoll.so* /usr/local/lib/
# and the Python package (it finds libcoll in /usr/local/lib from there; add the folder to
# PYTHONPATH):
#   COPY --from=coll-agent /usr/local/lib/python3/dist-packages/coll /usr/local/lib/python3/dist-packages/coll
# It runs as uid 65532 (non-root); the agent's socket goes on a shared volume.

# NVIDIA's CUDA images carry the toolkit and NCCL (devel: headers; runtime: libraries)
ARG BUILD_IMAGE=nvidia/cuda:12.6.3-devel-ubuntu24.04
ARG RUNTIME_IMAGE=nvidia/cuda:12.6.3-runtime-ubuntu24.04

FROM ${BUILD_IMAGE} AS build
ARG WITH_CUDA=ON
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        gcc make cmake pkg-config libyaml-dev libzmq3-dev libsodium-dev libmicrohttpd-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY CMakeLists.txt ./
COPY cmake cmake
COPY agent agent
COPY libcoll libcoll
COPY config config
COPY tools tools
COPY bench bench
COPY python python
RUN cmake -S . -B /build -DCMAKE_BUILD_TYPE=Release -DCOLL_BUILD_TESTS=OFF -DCOLL_PYTHON_DIR=lib/python3/dist-packages \
        -DCOLL_WITH_CUDA=${WITH_CUDA} -DCMAKE_INSTALL_PREFIX=/usr/local \
    && cmake --build /build -j"$(nproc)" \
    && cmake --install /build --prefix /install

FROM ${RUNTIME_IMAGE}
# libmicrohttpd12 is libmicrohttpd12t64 on Ubuntu 24.04
RUN apt-get update && mhd=$(apt-cache show libmicrohttpd12t64 >/dev/null 2>&1 \
        && echo libmicrohttpd12t64 || echo libmicrohttpd12) \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        libyaml-0-2 libzmq5 libsodium23 "$mhd" \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /install/ /usr/local/
RUN ldconfig && /usr/local/bin/coll-agent --version
USER 65532:65532
# the operational endpoints (http.port in the config) and the rendezvous and data ports
# are the config's; the chart names them
ENTRYPOINT ["/usr/local/bin/coll-agent"]
CMD ["--config", "/etc/coll/agent.yaml"]
