# Sourced by the bench scripts: start_agents BUILD N DIR PORT [EXTRA], and the load
# they measure under (start_load LOADGEN / stop_load, at the end).
# Starts N agents of BUILD on loopback, node i with socket DIR/i.sock and log DIR/i.log,
# all in one host-backend group "bench" whose coordinator listens on PORT; EXTRA is
# added to each agent section (e.g. "  spin_us: 0"), $NODE_EXTRA to each node section
# (e.g. "  tcp_congestion: bbr"), $GROUP_EXTRA to the group (e.g. "    local_slots: 2");
# $LOG_LEVEL sets their log level (default warn; info
# logs the path and spin counts at exit), $HEARTBEAT_MS their heartbeat (default 1000).
# Appends the agents' pids to AGENT_PIDS and sets AGENT_SOCKS (comma-separated, node
# order); returns once every socket accepts (at most 20 s in all). With PIN=1, agent i
# runs on CPU i mod nproc (and coll-bench -a pins application i the same way): one CPU
# per "pod".
# free_port: a TCP port on 127.0.0.1, free a moment ago, below the kernel's ephemeral
# range (a port in that range can be taken by any outgoing connection meanwhile)
free_port() {
    python3 - <<'PY'
import os, socket
lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
base = int.from_bytes(os.urandom(2), "little")
for i in range(5000):
    port = 10000 + (base + 7919 * i) % max(1, lo - 10000)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        print(port)
        break
    except OSError:
        pass
    finally:
        s.close()
PY
}

start_agents() {
    local try p
    for try in 1 2 3; do
        _start_agents "$@" && return 0
        # a port of ours was taken (a random one collided): all again, elsewhere
        kill "${AGENT_PIDS[@]}" 2>/dev/null || true
        for p in "${AGENT_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
        AGENT_PIDS=()
        set -- "$1" "$2" "$3" $((21000 + RANDOM % 20000)) "${5:-}"
    done
    echo "start_agents: the agents did not start (see $3/*.log)" >&2
    return 1
}
_start_agents() {
    local build=$1 n=$2 dir=$3 port=$4 extra=${5:-} i
    AGENT_SOCKS=""
    for i in $(seq 0 $((n - 1))); do
        cat >"$dir/$i.yaml" <<YAML
agent:
  socket: $dir/$i.sock
  log_level: ${LOG_LEVEL:-warn}
$extra
node:
  index: $i
${NODE_EXTRA:-}
discovery:
  peers: ["127.0.0.1:$port"]
groups:
  - name: bench
    backend: host
    members: $n
    timeouts: {op_ms: 120000, heartbeat_ms: ${HEARTBEAT_MS:-1000}}
${GROUP_EXTRA:-}
YAML
        if [ "${PIN:-0}" = 1 ]; then
            taskset -c $((i % $(nproc))) "$build/coll-agent" --config "$dir/$i.yaml" 2>"$dir/$i.log" &
        else
            "$build/coll-agent" --config "$dir/$i.yaml" 2>"$dir/$i.log" &
        fi
        AGENT_PIDS+=($!)
        AGENT_SOCKS="${AGENT_SOCKS:+$AGENT_SOCKS,}$dir/$i.sock"
    done
    # ready: each socket accepts (an agent binds its path early and listens last, once
    # its net thread is up; under a sanitizer and the load that took over 0.2 s), or
    # its agent exited (one that lost its rendezvous port to another process)
    python3 - "$dir" "${AGENT_PIDS[@]: -$n}" <<'PY'
import os, socket, sys, time
d, pids = sys.argv[1], [int(p) for p in sys.argv[2:]]
end = time.monotonic() + 20
for i, pid in enumerate(pids):
    while True:
        try:
            os.kill(pid, 0)
        except OSError:
            sys.exit(1)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            s.connect(f"{d}/{i}.sock")
            break
        except OSError:
            if time.monotonic() > end:
                sys.exit(1)
            time.sleep(0.02)
        finally:
            s.close()
PY
}

# stop_agents: end the agents in AGENT_PIDS (and wait for them), and empty it.
stop_agents() {
    local p
    for p in "${AGENT_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${AGENT_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    AGENT_PIDS=()
}

# start_load LOADGEN (bench/loadgen.c, built by the caller): the benchmarks' background
# load, a nice-19 busy loop pinned to every CPU and a normal-priority neighbour busy half
# of every 10 ms; appends their pids to LOAD_PIDS. stop_load ends them.
start_load() {
    local i
    for i in $(seq 0 $(($(nproc) - 1))); do "$1" spin "$i" & LOAD_PIDS+=($!); done
    "$1" duty 50 & LOAD_PIDS+=($!)
    sleep 0.5
}
# load_if_asked BIN: with LOAD=1, bench/loadgen.c built at BIN and started (start_load)
load_if_asked() {
    [ "${LOAD:-0}" = 1 ] || return 0
    cc -O2 -o "$1" "$(dirname "${BASH_SOURCE[0]}")/loadgen.c"
    start_load "$1"
}
stop_load() {
    local p
    for p in "${LOAD_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    LOAD_PIDS=()
}

# build_pair_bench OUT BUILD: bench/pair_bench.c (coll and OpenMPI in one process) with
# mpicc, against BUILD's libcoll (an unsanitized one: OpenMPI's libraries are not).
build_pair_bench() {
    local src
    src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    mpicc -O2 -Wall -I"$src/libcoll/include" -o "$1" "$src/bench/pair_bench.c" \
        -L"$2" -lcoll -Wl,-rpath,"$2"
}

# MPI_MALLOC_ENV: the prefix every script puts before mpirun. OpenMPI's large ops take
# their temporary buffers with malloc and free them on every call, and glibc's default
# malloc maps such buffers fresh and unmaps them each time: a page fault per 4 KiB per
# op (an 8 MiB reduce_scatter of two ranks, 2032 per rank), which some VMs charge
# dearly for (76 ms against 7.4 ms on the VM of 2026-12-05). coll keeps its scratch from
# op to op; the reference gets the same chance: no mmap in malloc, and freed memory
# kept. MPI_MALLOC=default in the environment runs OpenMPI on glibc's defaults.
MPI_MALLOC_ENV=(env MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=4294967296 MALLOC_TOP_PAD_=67108864)
if [ "${MPI_MALLOC:-}" = default ]; then MPI_MALLOC_ENV=(); fi
