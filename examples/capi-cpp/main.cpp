// A C++ program that owns its coordinates, forces and CUDA streams and runs halo's exchange on
// them through the C API (halo.h), as a simulation code such as GROMACS would.
//
// Two ranks split a periodic box along x into two slabs. Each rank sends the atoms within
// `cutoff` of its lower face to the rank below (pulse 0) and those within `cutoff` of its upper
// face to the rank above (pulse 1); with two ranks both neighbours are the other rank, and the
// pulses that cross the box edge carry a periodic shift of one box length. The program allocates
// x and f with cudaMalloc, runs coordinates then forces on its own streams, copies back and
// compares with a CPU reference computed here: coordinates bit for bit, forces exactly (they are
// small integers, so every order of additions gives the same sums). Then it times N steps and
// checks again.
//
//   capi-cpp [--atoms N] [--steps N] [--warmup N] [--transport NAME] [--device N] [--pe]
//
// One process runs both ranks (halo_local_create); with --pe, under
// `halo launch -n 2 --exe capi-cpp -- --pe`, each
// process is one NVSHMEM PE with its rank's plan only (halo_pe_create). Exit code 0 and the line
// "capi-cpp: PASS" on success; on any error the call, its halo_status and halo_last_error.

#include <halo.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr int kRanks = 2;
constexpr int kPulses = 2;
constexpr float kBox[3] = {10.0f, 3.0f, 3.0f};  // periodic box (nm); slabs along x
constexpr float kCutoff = 1.0f;                 // halo width (nm)

struct Float3 {
    float x, y, z;
};

// Any failure: the message already says which call and why.
struct Failure : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Throws with halo's own message when a halo call fails.
void check(halo_status status, const char* call) {
    if (status == HALO_OK) {
        return;
    }
    std::string message(halo_last_error_length() + 1, '\0');
    halo_last_error(message.data(), message.size());
    message.resize(std::strlen(message.c_str()));
    throw Failure(std::string(call) + " failed with " + halo_status_name(status) + ": " + message);
}

void check_cuda(cudaError_t e, const char* call) {
    if (e != cudaSuccess) {
        throw Failure(std::string(call) + " failed: " + cudaGetErrorString(e));
    }
}

#define HALO(call) check((call), #call)
#define CUDA(call) check_cuda((call), #call)

struct Options {
    size_t atoms = 400;  // home atoms of both ranks together
    int steps = 200;
    int warmup = 20;
    std::string transport = "fused";
    int device = 0;
    bool pe = false;
};

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) {
                throw Failure(a + " needs a value");
            }
            return argv[++i];
        };
        if (a == "--atoms") {
            o.atoms = std::stoul(value());
        } else if (a == "--steps") {
            o.steps = std::stoi(value());
        } else if (a == "--warmup") {
            o.warmup = std::stoi(value());
        } else if (a == "--transport") {
            o.transport = value();
        } else if (a == "--device") {
            o.device = std::stoi(value());
        } else if (a == "--pe") {
            o.pe = true;
        } else {
            throw Failure("unknown argument " + a +
                          " (usage: capi-cpp [--atoms N] [--steps N] [--warmup N] [--transport NAME] [--device N] [--pe])");
        }
    }
    if (o.atoms < 2 * kRanks || o.steps < 1 || o.warmup < 0) {
        throw Failure("--atoms must be at least 4 and --steps at least 1");
    }
    return o;
}

// The whole decomposition, as every rank's plan describes it.
struct Decomposition {
    std::vector<Float3> home[kRanks];               // home coordinates
    std::vector<int32_t> map[kRanks][kPulses];      // local indices sent in each pulse
    size_t recv[kRanks][kPulses] = {};              // atoms received per pulse
    size_t offset[kRanks][kPulses] = {};            // where they land
    Float3 shift[kRanks][kPulses] = {};             // shift of the sent coordinates
    bool shifted[kRanks][kPulses] = {};
    size_t total[kRanks] = {};

    size_t homes(int r) const { return home[r].size(); }
};

// A fixed pseudo-random sequence (the same on every run and every PE).
struct Lcg {
    uint64_t s;
    float next() {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        return static_cast<float>((s >> 40) & 0xffffff) / static_cast<float>(1 << 24);
    }
};

Decomposition decompose(size_t atoms) {
    Decomposition d;
    const float slab = kBox[0] / kRanks;
    for (int r = 0; r < kRanks; ++r) {
        Lcg rng{0x5eed0000ull + static_cast<uint64_t>(r)};
        size_t n = atoms / kRanks + (static_cast<size_t>(r) < atoms % kRanks ? 1 : 0);
        for (size_t i = 0; i < n; ++i) {
            d.home[r].push_back({slab * (r + rng.next()), kBox[1] * rng.next(), kBox[2] * rng.next()});
        }
        const float lo = slab * r, hi = slab * (r + 1);
        for (size_t i = 0; i < n; ++i) {
            if (d.home[r][i].x - lo < kCutoff) d.map[r][0].push_back(static_cast<int32_t>(i));  // to the rank below
            if (hi - d.home[r][i].x < kCutoff) d.map[r][1].push_back(static_cast<int32_t>(i));  // to the rank above
        }
        // Rank 0's lower neighbour and the last rank's upper one lie across the box edge.
        d.shifted[r][0] = (r == 0);
        d.shift[r][0] = {kBox[0], 0.0f, 0.0f};
        d.shifted[r][1] = (r == kRanks - 1);
        d.shift[r][1] = {-kBox[0], 0.0f, 0.0f};
    }
    for (int r = 0; r < kRanks; ++r) {
        const int above = (r + 1) % kRanks, below = (r + kRanks - 1) % kRanks;
        d.recv[r][0] = d.map[above][0].size();  // pulse 0 comes from the rank above
        d.recv[r][1] = d.map[below][1].size();  // pulse 1 from the rank below
        d.offset[r][0] = d.homes(r);
        d.offset[r][1] = d.homes(r) + d.recv[r][0];
        d.total[r] = d.offset[r][1] + d.recv[r][1];
    }
    return d;
}

int send_rank(int r, int p) { return p == 0 ? (r + kRanks - 1) % kRanks : (r + 1) % kRanks; }
int recv_rank(int r, int p) { return p == 0 ? (r + 1) % kRanks : (r + kRanks - 1) % kRanks; }

// Rank r's plan through the C API.
halo_plan* make_plan(const Decomposition& d, int r) {
    halo_plan* plan = nullptr;
    HALO(halo_plan_create(d.homes(r), d.total[r], &plan));
    for (int p = 0; p < kPulses; ++p) {
        halo_pulse_desc desc{};
        desc.send_rank = send_rank(r, p);
        desc.recv_rank = recv_rank(r, p);
        desc.index_map = d.map[r][p].data();
        desc.send_count = d.map[r][p].size();
        desc.recv_count = d.recv[r][p];
        desc.atom_offset = d.offset[r][p];
        desc.peer_atom_offset = d.offset[send_rank(r, p)][p];
        desc.has_shift = d.shifted[r][p] ? 1 : 0;
        desc.shift[0] = d.shift[r][p].x;
        desc.shift[1] = d.shift[r][p].y;
        desc.shift[2] = d.shift[r][p].z;
        desc.accumulate_forces = 1;
        HALO(halo_plan_add_pulse(plan, &desc));
    }
    return plan;
}

// The coordinates every rank must hold after the coordinate halo.
std::vector<Float3> reference_x(const Decomposition& d, int r) {
    std::vector<Float3> x(d.home[r]);
    x.resize(d.total[r]);
    for (int p = 0; p < kPulses; ++p) {
        const int from = recv_rank(r, p);
        for (size_t k = 0; k < d.map[from][p].size(); ++k) {
            Float3 v = d.home[from][d.map[from][p][k]];
            if (d.shifted[from][p]) {
                v = {v.x + d.shift[from][p].x, v.y + d.shift[from][p].y, v.z + d.shift[from][p].z};
            }
            x[d.offset[r][p] + k] = v;
        }
    }
    return x;
}

// The initial forces: small integers on every atom (home and received).
std::vector<Float3> initial_f(const Decomposition& d, int r) {
    std::vector<Float3> f(d.total[r]);
    for (size_t i = 0; i < f.size(); ++i) {
        f[i] = {static_cast<float>(static_cast<int>((i * 7 + r * 3) % 17) - 8), static_cast<float>(static_cast<int>((i * 5 + 1) % 11) - 5),
                static_cast<float>(static_cast<int>((i * 3 + r) % 13) - 6)};
    }
    return f;
}

// What one force halo adds to rank r's home atoms: every rank's forces on the atoms it received
// from r, through r's maps. Received atoms' forces are not changed by the exchange.
std::vector<Float3> force_increment(const Decomposition& d, int r) {
    std::vector<Float3> add(d.homes(r), Float3{0, 0, 0});
    for (int p = kPulses - 1; p >= 0; --p) {
        const int holder = send_rank(r, p);  // received r's atoms in pulse p
        const std::vector<Float3> fh = initial_f(d, holder);
        for (size_t k = 0; k < d.map[r][p].size(); ++k) {
            const Float3 v = fh[d.offset[holder][p] + k];
            Float3& a = add[d.map[r][p][k]];
            a = {a.x + v.x, a.y + v.y, a.z + v.z};
        }
    }
    return add;
}

// Compares rank r's x (all atoms, bit for bit) and f (home atoms, after `steps` force halos).
std::string compare(const Decomposition& d, int r, const std::vector<Float3>& x, const std::vector<Float3>& f, int steps) {
    const std::vector<Float3> want_x = reference_x(d, r);
    for (size_t i = 0; i < want_x.size(); ++i) {
        if (std::memcmp(&x[i], &want_x[i], sizeof(Float3)) != 0) {
            char buf[256];
            std::snprintf(buf, sizeof buf, "rank %d atom %zu (%s): x = (%g, %g, %g), expected (%g, %g, %g)", r, i,
                          i < d.homes(r) ? "home" : "received", x[i].x, x[i].y, x[i].z, want_x[i].x, want_x[i].y, want_x[i].z);
            return buf;
        }
    }
    const std::vector<Float3> f0 = initial_f(d, r), add = force_increment(d, r);
    for (size_t i = 0; i < d.homes(r); ++i) {
        const Float3 want = {f0[i].x + steps * add[i].x, f0[i].y + steps * add[i].y, f0[i].z + steps * add[i].z};
        if (f[i].x != want.x || f[i].y != want.y || f[i].z != want.z) {
            char buf[256];
            std::snprintf(buf, sizeof buf, "rank %d home atom %zu after %d force halo(s): f = (%g, %g, %g), expected (%g, %g, %g)", r, i,
                          steps, f[i].x, f[i].y, f[i].z, want.x, want.y, want.z);
            return buf;
        }
    }
    return "";
}

// One rank's device buffers, owned by this program (or, with --pe, allocated by halo_pe_alloc).
struct RankBuffers {
    float* x = nullptr;
    float* f = nullptr;
    cudaStream_t stream = nullptr;
};

void upload(const Decomposition& d, int r, const RankBuffers& b) {
    std::vector<Float3> x(d.total[r], Float3{NAN, NAN, NAN});  // received atoms start as NaN
    std::copy(d.home[r].begin(), d.home[r].end(), x.begin());
    const std::vector<Float3> f = initial_f(d, r);
    CUDA(cudaMemcpy(b.x, x.data(), x.size() * sizeof(Float3), cudaMemcpyHostToDevice));
    CUDA(cudaMemcpy(b.f, f.data(), f.size() * sizeof(Float3), cudaMemcpyHostToDevice));
}

std::string download_and_compare(const Decomposition& d, int r, const RankBuffers& b, int steps) {
    std::vector<Float3> x(d.total[r]), f(d.total[r]);
    CUDA(cudaMemcpy(x.data(), b.x, x.size() * sizeof(Float3), cudaMemcpyDeviceToHost));
    CUDA(cudaMemcpy(f.data(), b.f, f.size() * sizeof(Float3), cudaMemcpyDeviceToHost));
    return compare(d, r, x, f, steps);
}

// One step as a simulation runs it: the coordinate halo, (force computation), the force halo,
// all enqueued on the caller's streams; then the bounded wait where the host needs the results.
void step(halo_exchange* ex, const std::vector<cudaStream_t>& streams) {
    const CUstream* s = streams.data();  // cudaStream_t and CUstream are the same type
    HALO(halo_exchange_coordinates(ex, s, static_cast<int32_t>(streams.size())));
    HALO(halo_exchange_forces(ex, s, static_cast<int32_t>(streams.size())));
    HALO(halo_exchange_finish(ex));
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The first difference of the local ranks `mine` from the reference after `steps` steps, said at
// once on stderr (a PE that fails may be ended by the launcher before it reports at the end), or
// "" when they match.
std::string check_ranks(const char* when, const Decomposition& d, const std::vector<int>& mine, const std::vector<RankBuffers>& bufs, int steps) {
    for (size_t i = 0; i < mine.size(); ++i) {
        const std::string bad = download_and_compare(d, mine[i], bufs[i], steps);
        if (!bad.empty()) {
            std::fprintf(stderr, "capi-cpp: MISMATCH %s: %s\n", when, bad.c_str());
            return std::string(when) + ": " + bad;
        }
    }
    return "";
}

// Runs the checked step, the timed steps and the final check over the local ranks `mine`. Every
// rank runs every step whatever its check found: its peers wait for its launches.
std::string run(halo_exchange* ex, const Decomposition& d, const std::vector<int>& mine, const std::vector<RankBuffers>& bufs, const Options& o,
                double* median_us) {
    std::vector<cudaStream_t> streams;
    for (const RankBuffers& b : bufs) streams.push_back(b.stream);
    step(ex, streams);
    const std::string first = check_ranks("after the first step", d, mine, bufs, 1);
    std::vector<double> times;
    for (int s = 0; s < o.warmup + o.steps; ++s) {
        const auto t0 = std::chrono::steady_clock::now();
        step(ex, streams);
        const auto t1 = std::chrono::steady_clock::now();
        if (s >= o.warmup) times.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    *median_us = median(times);
    const std::string last = check_ranks("after the timed steps", d, mine, bufs, 1 + o.warmup + o.steps);
    return first.empty() ? last : first;
}

int run_local(const Options& o, const Decomposition& d, halo_plan* const* plans) {
    HALO(halo_check_device(o.device));  // without a GPU this says so, before anything is allocated
    CUDA(cudaSetDevice(o.device));
    std::vector<RankBuffers> bufs(kRanks);
    std::vector<float*> xs, fs;
    std::vector<size_t> lens;
    for (int r = 0; r < kRanks; ++r) {
        CUDA(cudaMalloc(reinterpret_cast<void**>(&bufs[r].x), d.total[r] * sizeof(Float3)));
        CUDA(cudaMalloc(reinterpret_cast<void**>(&bufs[r].f), d.total[r] * sizeof(Float3)));
        CUDA(cudaStreamCreateWithFlags(&bufs[r].stream, cudaStreamNonBlocking));
        upload(d, r, bufs[r]);
        xs.push_back(bufs[r].x);
        fs.push_back(bufs[r].f);
        lens.push_back(d.total[r]);
    }
    halo_exchange* ex = nullptr;
    HALO(halo_local_create(o.device, plans, kRanks, xs.data(), fs.data(), lens.data(), &ex));
    HALO(halo_exchange_set_transport(ex, o.transport.c_str()));
    double us = 0;
    const std::string bad = run(ex, d, {0, 1}, bufs, o, &us);
    HALO(halo_exchange_destroy(ex));
    for (RankBuffers& b : bufs) {
        CUDA(cudaStreamDestroy(b.stream));
        CUDA(cudaFree(b.x));
        CUDA(cudaFree(b.f));
    }
    if (!bad.empty()) throw Failure("MISMATCH " + bad);
    std::printf("capi-cpp: PASS: 2 ranks in one process on GPU %d, %zu home atoms (%zu + %zu received), transport %s: coordinates bit-exact, "
                "forces exact after %d steps; per step (coordinates + forces + finish) median %.2f us over %d steps after %d warm-up\n",
                o.device, o.atoms, d.recv[0][0] + d.recv[0][1], d.recv[1][0] + d.recv[1][1], o.transport.c_str(), 1 + o.warmup + o.steps, us,
                o.steps, o.warmup);
    return 0;
}

int run_pe(const Options& o, const Decomposition& d, halo_plan* const* plans) {
    halo_pe* pe = nullptr;
    HALO(halo_pe_start(&pe));
    int32_t rank = 0, nranks = 0, device = 0;
    HALO(halo_pe_info(pe, &rank, &nranks, &device));
    if (nranks != kRanks) {
        HALO(halo_pe_destroy(pe));
        throw Failure("--pe needs exactly 2 PEs (halo launch -n 2 --exe capi-cpp -- --pe), this run has " + std::to_string(nranks));
    }
    CUDA(cudaSetDevice(device));
    // The same allocations in the same order on every PE (the symmetric heap); sized for the
    // larger rank so the sizes match.
    const size_t len = std::max(d.total[0], d.total[1]);
    RankBuffers b;
    HALO(halo_pe_alloc(pe, len, &b.x));
    HALO(halo_pe_alloc(pe, len, &b.f));
    CUDA(cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking));
    upload(d, rank, b);
    halo_exchange* ex = nullptr;
    HALO(halo_pe_create(pe, plans[rank], b.x, b.f, len, &ex));
    HALO(halo_exchange_set_transport(ex, o.transport.c_str()));
    double us = 0;
    const std::string bad = run(ex, d, {rank}, {b}, o, &us);
    HALO(halo_exchange_destroy(ex));
    CUDA(cudaStreamDestroy(b.stream));
    HALO(halo_pe_free(pe, b.f));
    HALO(halo_pe_free(pe, b.x));
    HALO(halo_pe_destroy(pe));
    if (!bad.empty()) throw Failure("MISMATCH " + bad);
    std::printf("capi-cpp: PASS: PE %d of 2 on GPU %d, %zu home atoms in all, transport %s: coordinates bit-exact, forces exact after %d "
                "steps; per step (coordinates + forces + finish) median %.2f us over %d steps after %d warm-up\n",
                rank, device, o.atoms, o.transport.c_str(), 1 + o.warmup + o.steps, us, o.steps, o.warmup);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    halo_plan* plans[kRanks] = {nullptr, nullptr};
    int code = 1;
    try {
        const Options o = parse(argc, argv);
        const Decomposition d = decompose(o.atoms);
        for (int r = 0; r < kRanks; ++r) plans[r] = make_plan(d, r);
        HALO(halo_plan_validate(plans, kRanks));
        code = o.pe ? run_pe(o, d, plans) : run_local(o, d, plans);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "capi-cpp: %s\n", e.what());
        code = 1;
    }
    for (halo_plan* p : plans) halo_plan_destroy(p);
    return code;
}
