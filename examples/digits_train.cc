// Data-parallel training on real data with gflow's GradientReducer: a small
// MLP (64 -> 64 ReLU -> 10 softmax) on the handwritten-digits data that
// Debian's python3-sklearn ships (1797 8x8 images, 10 classes).
//
//   gflowrun -n 4 -- digits_train [--mode dense|fp16|bf16|int8|int4|csc|csc16]
//                                 [--epochs N]
//                                 [--data PATH] [--density D] [--chunk C]
//                                 [--warmup-epochs E] [--momentum-correction]
//
// Every rank starts from the same weights (fixed seed), trains on its own
// shard of the training set (rank-strided), and the reducer averages the
// gradients in place each step, so the parameters stay identical on every
// rank (the program checks it at the end). Held-out accuracy (every fifth
// image) is printed by rank 0 as `accuracy=0.9xxx`; `params_hash=` is the same
// on every rank.
//
// Modes: dense float32; fp16 / bf16 on the wire; int8 / int4 = blocks of
// 128 quantized values with a float32 scale on the wire, with error feedback
// (the reducer's residuals); csc = coarse-grained sparse
// communication at --density (default 0.1) of --chunk-element chunks
// (default 32) with error feedback and a dense warm-up of --warmup-epochs
// (default 1); --momentum-correction moves the momentum (0.9) from the
// optimizer into the reducer (Deep Gradient Compression); csc16 = csc with a
// float16 wire. SGD, learning rate 0.05, momentum 0.9, batch 16 per rank.
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gflow/gflow.h"
#include "gflow/reducer.h"

namespace {

const char* kDefaultData = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";
constexpr int kIn = 64, kHidden = 64, kOut = 10;

struct Sample {
  float x[kIn];
  int label;
};

// digits.csv.gz: 64 pixel values (0..16) then the label, per line.
std::vector<Sample> load(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) {
    std::fprintf(stderr, "digits_train: cannot open %s (install python3-sklearn)\n", path.c_str());
    std::exit(77);
  }
  std::vector<Sample> out;
  char line[1024];
  while (gzgets(f, line, sizeof line)) {
    Sample s{};
    char* p = line;
    for (int i = 0; i < kIn; ++i) {
      s.x[i] = std::strtof(p, &p) / 16.0f;
      if (*p == ',') ++p;
    }
    s.label = static_cast<int>(std::strtol(p, &p, 10));
    if (s.label >= 0 && s.label < kOut) out.push_back(s);
  }
  gzclose(f);
  return out;
}

struct Model {
  std::vector<float> w1 = std::vector<float>(kHidden * kIn), b1 = std::vector<float>(kHidden),
                     w2 = std::vector<float>(kOut * kHidden), b2 = std::vector<float>(kOut);
  void init() {
    std::mt19937 rng(42);  // the same on every rank
    std::normal_distribution<float> n1(0.0f, std::sqrt(2.0f / kIn)),
        n2(0.0f, std::sqrt(1.0f / kHidden));
    for (float& w : w1) w = n1(rng);
    for (float& w : w2) w = n2(rng);
  }
  // Forward; returns the predicted class, fills hidden and probabilities.
  int forward(const float* x, float* h, float* p) const {
    for (int j = 0; j < kHidden; ++j) {
      float a = b1[j];
      for (int i = 0; i < kIn; ++i) a += w1[j * kIn + i] * x[i];
      h[j] = a > 0 ? a : 0;
    }
    float mx = -1e30f;
    for (int k = 0; k < kOut; ++k) {
      float a = b2[k];
      for (int j = 0; j < kHidden; ++j) a += w2[k * kHidden + j] * h[j];
      p[k] = a;
      mx = std::max(mx, a);
    }
    float sum = 0;
    for (int k = 0; k < kOut; ++k) sum += (p[k] = std::exp(p[k] - mx));
    int best = 0;
    for (int k = 0; k < kOut; ++k) {
      p[k] /= sum;
      if (p[k] > p[best]) best = k;
    }
    return best;
  }
};

struct Args {
  std::string mode = "dense", data = kDefaultData;
  int epochs = 30;
  double density = 0.1;
  size_t chunk = 32;
  bool correction = false;  // CSC momentum correction (else optimizer momentum)
  int warmupEpochs = 1;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "digits_train: %s needs a value\n", f.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (f == "--mode") {
      a.mode = value();
    } else if (f == "--data") {
      a.data = value();
    } else if (f == "--epochs") {
      a.epochs = std::atoi(value().c_str());
    } else if (f == "--density") {
      a.density = std::atof(value().c_str());
    } else if (f == "--chunk") {
      a.chunk = static_cast<size_t>(std::atol(value().c_str()));
    } else if (f == "--momentum-correction") {
      a.correction = true;
    } else if (f == "--warmup-epochs") {
      a.warmupEpochs = std::atoi(value().c_str());
    } else {
      std::fprintf(stderr, "digits_train: unknown flag %s\n", f.c_str());
      std::exit(2);
    }
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  const std::vector<Sample> all = load(args.data);
  try {
    auto comm = gflow::init();
    const int rank = comm->rank(), size = comm->size();
    std::vector<const Sample*> train, test;
    for (size_t i = 0; i < all.size(); ++i) (i % 5 == 4 ? test : train).push_back(&all[i]);
    std::vector<const Sample*> mine;  // this rank's shard
    for (size_t i = static_cast<size_t>(rank); i < train.size(); i += static_cast<size_t>(size)) {
      mine.push_back(train[i]);
    }

    Model m;
    m.init();
    Model g;  // gradients, registered in the order backward produces them
    gflow::ReducerOptions o;
    o.op = gflow::ReduceOp::kAvg;
    o.fusionThreshold = 1 << 20;  // one fused bucket: the whole model
    o.names = {"w2", "b2", "w1", "b1"};
    float momentum = 0.9f;  // optimizer momentum, unless CSC's correction holds it
    // From the global size, so every rank runs the same number of steps.
    const size_t shard = (train.size() + static_cast<size_t>(size) - 1) / static_cast<size_t>(size);
    const size_t stepsPerEpoch = (shard + 15) / 16;
    if (args.mode == "fp16" || args.mode == "csc16") o.wire = gflow::DataType::kFloat16;
    if (args.mode == "bf16") o.wire = gflow::DataType::kBFloat16;
    if (args.mode == "int8") o.wire = gflow::DataType::kQInt8;
    if (args.mode == "int4") o.wire = gflow::DataType::kQInt4;
    const bool wireOnly = args.mode == "dense" || args.mode == "fp16" || args.mode == "bf16" ||
                          args.mode == "int8" || args.mode == "int4";
    if (args.mode == "csc" || args.mode == "csc16") {
      o.sparse.density = args.density;
      o.sparse.chunk = args.chunk;
      o.sparse.warmupSteps = stepsPerEpoch * static_cast<size_t>(args.warmupEpochs);
      if (args.correction) {
        o.sparse.momentum = momentum;
        momentum = 0.0f;
      }
    } else if (!wireOnly) {
      std::fprintf(stderr, "digits_train: unknown mode %s\n", args.mode.c_str());
      return 2;
    }
    gflow::GradientReducer reducer(
        comm,
        {gflow::tensor(g.w2.data(), g.w2.size()), gflow::tensor(g.b2.data(), g.b2.size()),
         gflow::tensor(g.w1.data(), g.w1.size()), gflow::tensor(g.b1.data(), g.b1.size())},
        o);
    Model vel;  // optimizer momentum buffers
    std::mt19937 shuffle(static_cast<uint32_t>(7 + rank));
    const float lr = 0.05f;
    const size_t batch = 16;  // per rank
    uint64_t skipped = 0;
    for (int epoch = 0; epoch < args.epochs; ++epoch) {
      std::shuffle(mine.begin(), mine.end(), shuffle);
      for (size_t s = 0; s < stepsPerEpoch; ++s) {
        for (auto* v : {&g.w1, &g.b1, &g.w2, &g.b2}) std::fill(v->begin(), v->end(), 0.0f);
        float h[kHidden], p[kOut], dh[kHidden];
        const size_t begin = s * batch, end = std::min(mine.size(), begin + batch);
        for (size_t b = begin; b < end; ++b) {
          const Sample& x = *mine[b % mine.size()];
          m.forward(x.x, h, p);
          p[x.label] -= 1.0f;  // d(loss)/d(logits) for softmax cross-entropy
          const float scale = 1.0f / static_cast<float>(batch);
          for (int j = 0; j < kHidden; ++j) dh[j] = 0;
          for (int k = 0; k < kOut; ++k) {
            g.b2[k] += scale * p[k];
            for (int j = 0; j < kHidden; ++j) {
              g.w2[k * kHidden + j] += scale * p[k] * h[j];
              dh[j] += p[k] * m.w2[k * kHidden + j];
            }
          }
          for (int j = 0; j < kHidden; ++j) {
            if (h[j] <= 0) continue;
            g.b1[j] += scale * dh[j];
            for (int i = 0; i < kIn; ++i) g.w1[j * kIn + i] += scale * dh[j] * x.x[i];
          }
        }
        // The last layer's gradients are final first: hand them over while
        // the first layer's would still be computed in a real backward.
        reducer.ready(0);
        reducer.ready(1);
        reducer.ready(2);
        reducer.ready(3);
        reducer.wait();
        if (reducer.nonFinite()) {  // a loss scaler would lower its scale here
          ++skipped;
          continue;
        }
        auto apply = [&](std::vector<float>& w, std::vector<float>& grad, std::vector<float>& v) {
          for (size_t i = 0; i < w.size(); ++i) {
            v[i] = momentum * v[i] + grad[i];
            w[i] -= lr * v[i];
          }
        };
        apply(m.w1, g.w1, vel.w1);
        apply(m.b1, g.b1, vel.b1);
        apply(m.w2, g.w2, vel.w2);
        apply(m.b2, g.b2, vel.b2);
      }
    }
    // Held-out accuracy, and a hash of the parameters (identical on every rank).
    int correct = 0;
    float h[kHidden], p[kOut];
    for (const Sample* x : test) correct += m.forward(x->x, h, p) == x->label;
    uint64_t hash = 1469598103934665603ULL;
    for (auto* v : {&m.w1, &m.b1, &m.w2, &m.b2}) {
      for (float w : *v) {
        uint32_t bits;
        std::memcpy(&bits, &w, 4);
        hash = (hash ^ bits) * 1099511628211ULL;
      }
    }
    // Every rank checks that it holds the same parameters as rank 0.
    uint64_t root = hash;
    comm->broadcast(gflow::Tensor(&root, 1, gflow::DataType::kInt64), 0);
    if (root != hash) {
      std::fprintf(stderr, "digits_train: rank %d parameters differ from rank 0's\n", rank);
      return 1;
    }
    if (rank == 0) {
      const gflow::ReducerStats st = reducer.stats();
      std::printf(
          "mode=%s ranks=%d epochs=%d steps=%llu skipped=%llu accuracy=%.4f "
          "params_hash=%016llx bytes_sent=%llu chunks_sent=%llu/%llu\n",
          args.mode.c_str(), size, args.epochs, static_cast<unsigned long long>(st.steps),
          static_cast<unsigned long long>(skipped),
          static_cast<double>(correct) / static_cast<double>(test.size()),
          static_cast<unsigned long long>(hash),
          static_cast<unsigned long long>(reducer.communicator().stats().bytesSent()),
          static_cast<unsigned long long>(st.sparseChunksSent),
          static_cast<unsigned long long>(st.sparseChunks));
    }
    comm->barrier();
    gflow::finalize();
  } catch (const gflow::Error& e) {
    std::fprintf(stderr, "digits_train: %s\n", e.what());
    return 1;
  }
  return 0;
}
