// The table of every GFLOW_* parameter, one row each:
//   X(accessor, ENV_NAME, kind, default, scope, doc)
// accessor names the typed function params.h generates (params::shm()), kind
// its value type (params.h, Kind), default applies when the variable is unset
// or empty, and scope is kAgree for parameters every rank of a communicator
// must set alike (the creation-time configuration check compares them) or
// kLocal for parameters a rank may set on its own. Include params.h, not this.
#pragma once

#define GFLOW_PARAMS(X)                                                                            \
  X(timeoutMs, "GFLOW_TIMEOUT", kDurationMs, "300s", kLocal,                                       \
    "Deadline for every blocking step (connect, store, collective). Units: ms, s, m; "             \
    "a bare number is seconds.")                                                                   \
  X(debug, "GFLOW_DEBUG", kString, "WARN", kLocal, "Log level: ERROR, WARN, INFO, DEBUG, TRACE.")  \
  X(algo, "GFLOW_ALGO", kString, "", kAgree,                                                       \
    "Algorithm override: ring, rd, hd, hier or shm, or rules such as "                             \
    "'allreduce:0-64k:rd,allreduce:64k-:ring' "                                                    \
    "(docs/algorithms.md).")                                                                       \
  X(model, "GFLOW_MODEL", kString, "", kAgree,                                                     \
    "A cost model file (allreduce_bw --calibrate FILE): the flat network allreduce takes the "     \
    "algorithm it predicts fastest for the message size and world size (docs/scale.md). Every "    \
    "rank must load the same parameters. Empty: the measured default thresholds.")                 \
  X(transport, "GFLOW_TRANSPORT", kString, "tcp", kLocal,                                          \
    "Network transport between hosts (and between local ranks when GFLOW_SHM=0): tcp or "          \
    "verbs (RDMA, needs rdma-core's libibverbs and an RDMA device).")                              \
  X(deviceBackend, "GFLOW_DEVICE_BACKEND", kString, "auto", kAgree,                                \
    "CUDA tensors: nccl (NCCL on the caller's stream; an error when it cannot run), staged "       \
    "(copied through pinned host memory to the host backends), or auto (nccl when every rank "     \
    "loads NCCL and the ranks of a host use different GPUs, else staged).")                        \
  X(ncclVerify, "GFLOW_NCCL_VERIFY", kInt, "1", kAgree,                                            \
    "1: beside each NCCL collective (while the GPU runs it), ranks check over the host "           \
    "transport that they all call the same op; a mismatch aborts NCCL and is an error instead of " \
    "a hang or wrong data; 0: skip the check.")                                                    \
  X(ncclP2P, "GFLOW_NCCL_P2P", kInt, "0", kAgree,                                                  \
    "1: point-to-point on cuda tensors runs on NCCL (ncclSend/ncclRecv in one group per call) "    \
    "once NCCL runs the communicator; device messages between a pair are then received in the "    \
    "order they were sent. 0: staged through host memory.")                                        \
  X(reproducible, "GFLOW_REPRODUCIBLE", kInt, "0", kAgree,                                         \
    "1: allreduce and reduce-scatter reduce every element by one fixed tree over the ranks in "    \
    "one accumulation type, so results do not depend on buckets, algorithm, chunking or hosts "    \
    "(docs/algorithms.md, Reproducible mode); 0: the fastest algorithm.")                          \
  X(shm, "GFLOW_SHM", kInt, "1", kAgree,                                                           \
    "1: ranks on the same host exchange data through shared memory; 0: through the "               \
    "network transport.")                                                                          \
  X(shmChunk, "GFLOW_SHM_CHUNK", kBytes, "512K", kAgree,                                           \
    "Pipelining chunk of shared-memory collectives; each rank's segment holds two.")               \
  X(shmSingleCopy, "GFLOW_SHM_SINGLE_COPY", kString, "auto", kAgree,                               \
    "Shared-memory allreduces whose size falls in this byte range (LO-HI, e.g. 128K-32M or "       \
    "64K-) read the other local ranks' buffers directly (process_vm_readv) where the kernel "      \
    "lets every local rank read the others; off: never; auto: a measured range for two local "     \
    "ranks with a core each, off otherwise (docs/algorithms.md).")                                 \
  X(localSingleCopy, "GFLOW_LOCAL_SINGLE_COPY", kBytes, "128K", kLocal,                            \
    "Messages of at least this size that the network transport carries between two ranks of "      \
    "one host (point-to-point; collectives there run in shared memory) are read by the "           \
    "receiver straight from the sender's buffer (process_vm_readv) where the kernel lets it; "     \
    "0: never. Off under GFLOW_SHM=0.")                                                            \
  X(localRing, "GFLOW_LOCAL_RING", kBytes, "256K", kLocal,                                         \
    "Between two ranks of one host that read each other's memory (see GFLOW_LOCAL_SINGLE_COPY), "  \
    "the network transport's frames go through a shared-memory ring of this size per direction "   \
    "(a power of two; shared memory per rank: twice this per local peer) instead of the socket; "  \
    "0: through the socket. Off under GFLOW_SHM=0.")                                               \
  X(hierSegment, "GFLOW_HIER_SEGMENT", kBytes, "8M", kLocal,                                       \
    "Hierarchical allreduce pipelines segments of this size: the cross-host phase of one "         \
    "overlaps the local phases of the next.")                                                      \
  X(pin, "GFLOW_PIN", kInt, "1", kLocal,                                                           \
    "1: pin gflow's progress threads to the cores of the NUMA node nearest the rank's NIC; "       \
    "0: leave them unpinned.")                                                                     \
  X(progressPriority, "GFLOW_PROGRESS_PRIORITY", kInt, "0", kLocal,                                \
    "Nice levels gflow's progress thread runs above the thread that starts it, so that compute "   \
    "threads sharing its cores do not starve the exchange (e.g. 10; negative: below; 0: the "      \
    "same). Raising needs CAP_SYS_NICE or RLIMIT_NICE (ulimit -e); without, a warning.")           \
  X(socketIfname, "GFLOW_SOCKET_IFNAME", kString, "", kLocal,                                      \
    "Interfaces for data sockets: prefixes ('eth,ib'), '=' for exact names, '^' to exclude "       \
    "('^docker,lo'). Default: the first non-loopback interface that is up, else loopback.")        \
  X(portRange, "GFLOW_PORT_RANGE", kString, "", kLocal,                                            \
    "Listen ports for data sockets, 'lo-hi' (e.g. 50000-50100). Default: ephemeral.")              \
  X(socketsPerPeer, "GFLOW_SOCKETS_PER_PEER", kInt, "1", kLocal,                                   \
    "TCP connections per peer; messages >= GFLOW_STRIPE_MIN are striped across them.")             \
  X(connect, "GFLOW_CONNECT", kString, "auto", kAgree,                                             \
    "Which peers a TCP rank connects to: all (every peer at init), lazy (a peer when an op "       \
    "first needs it: ring neighbours, partners, leaders), auto (all up to 64 ranks, lazy above).") \
  X(stripeMin, "GFLOW_STRIPE_MIN", kBytes, "1M", kLocal,                                           \
    "Smallest message striped across several sockets of a peer.")                                  \
  X(stripeChunk, "GFLOW_STRIPE_CHUNK", kBytes, "128K", kLocal,                                     \
    "With several sockets per peer, messages go out in units (whole below GFLOW_STRIPE_MIN, "      \
    "pieces of this size above), each taken by the first socket whose queue has drained, so a "    \
    "faster socket carries more. 0: equal shares assigned up front.")                              \
  X(socketBuffer, "GFLOW_SOCKET_BUFFER", kBytes, "4M", kLocal,                                     \
    "SO_SNDBUF/SO_RCVBUF of data sockets.")                                                        \
  X(tcpCongestion, "GFLOW_TCP_CONGESTION", kString, "auto", kLocal,                                \
    "Congestion control of data sockets: auto (the system's unless it is bbr, whose pacing "       \
    "slows bursty collective traffic: then cubic, else reno), system, or an algorithm name.")      \
  X(rendezvous, "GFLOW_RENDEZVOUS", kBytes, "256K", kAgree,                                        \
    "TCP point-to-point messages of at least this size, and a collective's of at least 16 "        \
    "times it, wait with their sender until the receiver has posted the receive (a header goes "   \
    "ahead; the data follows the receiver's answer), so early data is never staged; 0: every "     \
    "message is sent at once.")                                                                    \
  X(unexpectedLimit, "GFLOW_UNEXPECTED_LIMIT", kBytes, "256M", kLocal,                             \
    "Bytes a peer may send ahead of the matching receive. TCP stops reading the peer "             \
    "(back-pressure); verbs fails the op (its eager ring also carries control messages).")         \
  X(spinUs, "GFLOW_SPIN_US", kIntOrAuto, "auto", kLocal,                                           \
    "Microseconds a waiting rank polls, yielding the core between polls, before sleeping "         \
    "(epoll, poll). 'auto': 1000 when the host's ranks fit the cpus of the process's affinity "    \
    "mask, else 100.")                                                                             \
  X(ibHca, "GFLOW_IB_HCA", kString, "", kLocal,                                                    \
    "verbs: RDMA devices/ports to use: 'mlx5_0:1,mlx5_1' (prefixes), '=' exact names, '^' "        \
    "to exclude. Default: the device nearest the rank's cpus, else the first active port.")        \
  X(ibGidIndex, "GFLOW_IB_GID_INDEX", kIntOrAuto, "auto", kLocal,                                  \
    "verbs: GID index for RoCE. 'auto': RoCE v2 IPv4-mapped, else IPv4-mapped, else the first "    \
    "non-zero GID.")                                                                               \
  X(ibTimeout, "GFLOW_IB_TIMEOUT", kInt, "18", kLocal,                                             \
    "verbs: ACK timeout exponent (4.096 us x 2^value, 1-31) before a retry.")                      \
  X(ibRetryCnt, "GFLOW_IB_RETRY_CNT", kInt, "7", kLocal,                                           \
    "verbs: retries (0-7) before a silent peer fails the transfer (retry exceeded).")              \
  X(ibMtu, "GFLOW_IB_MTU", kInt, "0", kLocal,                                                      \
    "verbs: path MTU in bytes (256-4096); 0 = the port's active MTU.")                             \
  X(ibQpsPerPeer, "GFLOW_IB_QPS_PER_PEER", kInt, "2", kLocal,                                      \
    "verbs: RC queue pairs per peer; large messages are striped over them.")                       \
  X(ibEagerBytes, "GFLOW_IB_EAGER_BYTES", kBytes, "8K", kLocal,                                    \
    "verbs: messages up to this size are copied through registered slots; larger ones are "        \
    "written zero-copy into the receiver's buffer.")                                               \
  X(ibEagerSlots, "GFLOW_IB_EAGER_SLOTS", kInt, "64", kLocal,                                      \
    "verbs: eager slots (credits) per peer and direction.")                                        \
  X(ibRegCache, "GFLOW_IB_REG_CACHE", kBytes, "4G", kLocal,                                        \
    "verbs: bound on per-op memory registrations; idle ones are dropped past it.")                 \
  X(cudaPlugin, "GFLOW_CUDA_PLUGIN", kString, "", kLocal,                                          \
    "Path of gflow's CUDA component (libgflow_cuda.so.0), loaded when an op meets a device "       \
    "tensor. Default: next to libgflow, then the loader's search path.")                           \
  X(pieceBytes, "GFLOW_PIECE_BYTES", kBytes, "256K", kLocal,                                       \
    "Pipelining granularity of ring algorithms (send/receive/reduce overlap).")                    \
  X(codecPiece, "GFLOW_CODEC_PIECE", kBytes, "4M", kAgree,                                         \
    "A compressed allreduce of host float32 data (AllreduceOptions::wire) of 1.5 times this "      \
    "many bytes or more runs as consecutive collectives on pieces of about this size, so that "    \
    "one "                                                                                         \
    "piece's narrowing and widening run beside another's wire time (docs/compression.md); 0: "     \
    "one collective.")                                                                             \
  X(ringWindow, "GFLOW_RING_WINDOW", kInt, "8", kLocal,                                            \
    "Ring pieces in flight per step (bounds staging memory to window x piece).")                   \
  X(rdMaxBytes, "GFLOW_RD_MAX_BYTES", kBytesOrAuto, "auto", kAgree,                                \
    "Allreduce of at most this many bytes uses recursive doubling, above it halving-doubling "     \
    "(up to GFLOW_HD_MAX_BYTES) or ring. 'auto': 512K on 2 ranks, else 64K.")                      \
  X(hdMaxBytes, "GFLOW_HD_MAX_BYTES", kBytesOrAuto, "auto", kAgree,                                \
    "Allreduce above GFLOW_RD_MAX_BYTES and of at most this many bytes uses halving-doubling, "    \
    "above it ring. 'auto': 8M on 2 ranks, else 16M.")                                             \
  X(fusionThreshold, "GFLOW_FUSION_THRESHOLD", kBytes, "2M", kLocal,                               \
    "Chunk fusion bucket size of GradientReducer and allreduceCoalesced; tensors of at least "     \
    "this size are reduced in place.")                                                             \
  X(cycleTimeMs, "GFLOW_CYCLE_TIME_MS", kInt, "0", kLocal,                                         \
    "GradientReducer: 0 = fixed buckets; > 0 = negotiated rounds; a round starts at the "          \
    "latest this many ms after the last one while gradients wait.")                                \
  X(cscDensity, "GFLOW_CSC_DENSITY", kString, "0", kLocal,                                         \
    "GradientReducer CSC: fraction of chunks sent per step, (0, 1]; 0 = dense.")                   \
  X(cscChunk, "GFLOW_CSC_CHUNK", kInt, "1024", kLocal, "GradientReducer CSC: elements per chunk.") \
  X(wire, "GFLOW_WIRE", kString, "float32", kLocal,                                                \
    "GradientReducer: how float32 gradients travel when the options do not say: float32, "         \
    "float16, bfloat16, qint8, qint4, or auto (a wire per bucket from measured link and "          \
    "overlap, docs/compression.md).")                                                              \
  X(wireAutoCandidates, "GFLOW_WIRE_AUTO_CANDIDATES", kString, "float32,bfloat16,qint8,qint4",     \
    kLocal, "Automatic wire: the wires it picks from, widest first (the first is the warm-up's).") \
  X(wireAutoWarmup, "GFLOW_WIRE_AUTO_WARMUP", kInt, "20", kLocal,                                  \
    "Automatic wire: steps that run on the widest candidate before the first probe.")              \
  X(wireAutoPeriod, "GFLOW_WIRE_AUTO_PERIOD", kInt, "50", kLocal,                                  \
    "Automatic wire: steps between agreements (a small allreduce) and re-decisions.")              \
  X(wireAutoReprobe, "GFLOW_WIRE_AUTO_REPROBE", kInt, "20", kLocal,                                \
    "Automatic wire: periods between probes of every candidate; 0: probe once.")                   \
  X(timeline, "GFLOW_TIMELINE", kString, "", kLocal,                                               \
    "Chrome trace file of GradientReducer steps; %r in the name becomes the rank (without "        \
    "it only rank 0 writes).")                                                                     \
  X(straggler, "GFLOW_STRAGGLER", kInt, "1", kLocal,                                               \
    "1: messages of collectives carry arrival stamps and every rank records which rank reached "   \
    "each op last and by how much (Stats, docs/errors.md, Stragglers); 0: no bookkeeping.")        \
  X(stragglerReport, "GFLOW_STRAGGLER_REPORT", kDurationMs, "0", kLocal,                           \
    "Rank 0 prints a straggler summary this often ('rank 3 was last in 96% of 1200 ops, median "   \
    "skew 14.00 ms') and the whole run's when the communicator ends; 0: never.")                   \
  X(stragglerAtExit, "GFLOW_STRAGGLER_AT_EXIT", kInt, "0", kLocal,                                 \
    "1: rank 0 prints the whole run's straggler summary when the communicator ends (gflowrun "     \
    "sets it).")                                                                                   \
  X(rank, "GFLOW_RANK", kInt, "", kLocal, "This process's rank.")                                  \
  X(worldSize, "GFLOW_WORLD_SIZE", kInt, "", kLocal, "Number of ranks.")                           \
  X(localRank, "GFLOW_LOCAL_RANK", kInt, "", kLocal, "Rank among the ranks of this host.")         \
  X(localSize, "GFLOW_LOCAL_SIZE", kInt, "", kLocal, "Number of ranks on this host.")              \
  X(root, "GFLOW_ROOT", kString, "", kLocal,                                                       \
    "host:port of the job's store: rank 0's, or one served outside the job "                       \
    "(GFLOW_ROOT_EXTERNAL).")                                                                      \
  X(join, "GFLOW_JOIN", kInt, "0", kLocal,                                                         \
    "1 (gflowrun --elastic sets it in a replacement, which has no rank): the program joins the "   \
    "running job with Communicator::join() instead of creating it (docs/elastic.md).")             \
  X(rootExternal, "GFLOW_ROOT_EXTERNAL", kInt, "0", kLocal,                                        \
    "1: the store at GFLOW_ROOT is served outside the job (gflowrun --elastic serves it), so "     \
    "rank 0 is its client like every rank and the store outlives any one rank "                    \
    "(docs/elastic.md).")                                                                          \
  X(jobToken, "GFLOW_JOB_TOKEN", kString, "", kLocal,                                              \
    "Job secret; store and data connections prove knowledge of it (HMAC-SHA256). gflowrun "        \
    "generates one.")                                                                              \
  X(requireToken, "GFLOW_REQUIRE_TOKEN", kInt, "0", kLocal,                                        \
    "1: a communicator without a job token (GFLOW_JOB_TOKEN or gflowrun's) fails at "              \
    "creation instead of warning that any stranger may join.")                                     \
  X(hostId, "GFLOW_HOST_ID", kString, "", kLocal,                                                  \
    "Overrides host identity (hostname + boot id) for grouping ranks into hosts.")

// The accepted values of every numeric parameter, one row each:
//   R(accessor, lo, hi, zeroMeansOff)
// in the parameter's unit (bytes, ms, or a plain number); zeroMeansOff also
// accepts 0 below lo. A value outside fails at init (params::validateAll,
// from Communicator::create) naming the variable and this range. The ranges
// keep out values that parse but make no sense: a 1-byte stripe or piece,
// thousands of sockets per peer, a timeout of 0.
#define GFLOW_PARAM_RANGES(R)                     \
  R(timeoutMs, 1, 30LL * 24 * 3600 * 1000, false) \
  R(ncclVerify, 0, 1, false)                      \
  R(ncclP2P, 0, 1, false)                         \
  R(shm, 0, 1, false)                             \
  R(reproducible, 0, 1, false)                    \
  R(straggler, 0, 1, false)                       \
  R(stragglerReport, 1, 30LL * 86400000, true)    \
  R(stragglerAtExit, 0, 1, false)                 \
  R(shmChunk, 4096, 1LL << 30, false)             \
  R(localSingleCopy, 4096, 1LL << 46, true)       \
  R(localRing, 4096, 1LL << 30, true)             \
  R(hierSegment, 4096, 1LL << 40, false)          \
  R(pin, 0, 1, false)                             \
  R(progressPriority, -39, 39, false)             \
  R(socketsPerPeer, 1, 64, false)                 \
  R(stripeMin, 0, 1LL << 46, false)               \
  R(stripeChunk, 4096, 1LL << 30, true)           \
  R(socketBuffer, 16384, 1LL << 31, false)        \
  R(rendezvous, 4096, 1LL << 46, true)            \
  R(unexpectedLimit, 65536, 1LL << 46, false)     \
  R(spinUs, 0, 10000000, false)                   \
  R(ibGidIndex, 0, 255, false)                    \
  R(ibTimeout, 1, 31, false)                      \
  R(ibRetryCnt, 0, 7, false)                      \
  R(ibMtu, 256, 4096, true)                       \
  R(ibQpsPerPeer, 1, 16, false)                   \
  R(ibEagerBytes, 64, 1LL << 20, false)           \
  R(ibEagerSlots, 2, 4096, false)                 \
  R(ibRegCache, 0, 1LL << 46, false)              \
  R(pieceBytes, 64, 1LL << 30, false)             \
  R(codecPiece, 65536, 1LL << 40, true)           \
  R(ringWindow, 1, 1024, false)                   \
  R(rdMaxBytes, 0, 1LL << 46, false)              \
  R(hdMaxBytes, 0, 1LL << 46, false)              \
  R(fusionThreshold, 1, 1LL << 40, false)         \
  R(cycleTimeMs, 0, 3600000, false)               \
  R(cscChunk, 1, 1LL << 24, false)                \
  R(wireAutoWarmup, 0, 1LL << 40, false)          \
  R(wireAutoPeriod, 1, 1LL << 40, false)          \
  R(wireAutoReprobe, 0, 1LL << 40, false)         \
  R(rank, 0, (1LL << 24) - 1, false)              \
  R(worldSize, 1, 1LL << 24, false)               \
  R(localRank, 0, (1LL << 24) - 1, false)         \
  R(localSize, 1, 1LL << 24, false)               \
  R(join, 0, 1, false)                            \
  R(rootExternal, 0, 1, false)                    \
  R(requireToken, 0, 1, false)

// The parameters whose value is a secret, one row each: S(accessor). No
// message, log line, report or listing shows their value, only whether it
// is set (params::shownValue, the one path by which a value is printed).
#define GFLOW_PARAM_SECRETS(S) S(jobToken)
