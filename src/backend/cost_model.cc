#include "backend/cost_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <mutex>
#include <sstream>
#include <utility>

#include "common/check.h"

namespace gflow::backend {
namespace {

using Coeffs = std::array<double, 3>;  // of alpha, beta, gamma

int log2Floor(int n) {
  int k = 0;
  while ((2 << k) <= n) ++k;
  return k;
}

// What one allreduce of `bytes` over `ranks` costs in alpha, beta and gamma
// (cost_model.h); all zero for an algorithm the model does not know, which
// `known` says.
Coeffs coefficients(Algorithm algo, uint64_t bytes, int ranks, bool* known) {
  *known = true;
  if (ranks <= 1) return {0, 0, 0};
  const double n = static_cast<double>(bytes), N = ranks;
  const int steps = log2Floor(ranks);
  const double q = static_cast<double>(1 << steps);
  const Coeffs fold = q == N ? Coeffs{0, 0, 0} : Coeffs{2, 2 * n, n};
  switch (algo) {
    case Algorithm::kRing: return {2 * (N - 1), 2 * (N - 1) / N * n, (N - 1) / N * n};
    case Algorithm::kRecursiveDoubling:
      return {steps + fold[0], steps * n + fold[1], steps * n + fold[2]};
    case Algorithm::kHalvingDoubling:
      return {2.0 * steps + fold[0], 2 * (q - 1) / q * n + fold[1], (q - 1) / q * n + fold[2]};
    default: *known = false; return {0, 0, 0};
  }
}

// Seconds of a flat allreduce with these parameters (+infinity for an
// algorithm the model does not know).
double secondsOf(const CostModel::Params& p, Algorithm algo, uint64_t bytes, int ranks) {
  bool known = false;
  const Coeffs c = coefficients(algo, bytes, ranks, &known);
  if (!known) return std::numeric_limits<double>::infinity();
  return c[0] * p.alpha + c[1] * p.beta + c[2] * p.gamma;
}

[[noreturn]] void bad(const std::string& source, const std::string& what) {
  GFLOW_THROW(kInvalidArgument, ErrorContext::forOp("config")) << source << ": " << what;
}

// Least squares of rows `a` (scaled) against `b` over the parameters in
// `use`; false when they are not determined. Unused parameters stay 0.
bool solve(const std::vector<Coeffs>& a, const std::vector<double>& b, std::array<bool, 3> use,
           Coeffs* x, double* residual) {
  std::array<int, 3> idx{};
  int m = 0;
  for (int j = 0; j < 3; ++j) {
    if (use[j]) idx[m++] = j;
  }
  double ata[3][4] = {};  // normal equations, augmented
  for (size_t i = 0; i < a.size(); ++i) {
    for (int r = 0; r < m; ++r) {
      for (int c = 0; c < m; ++c) ata[r][c] += a[i][idx[r]] * a[i][idx[c]];
      ata[r][m] += a[i][idx[r]] * b[i];
    }
  }
  for (int c = 0; c < m; ++c) {  // Gauss-Jordan with partial pivoting
    int p = c;
    for (int r = c + 1; r < m; ++r) {
      if (std::fabs(ata[r][c]) > std::fabs(ata[p][c])) p = r;
    }
    if (std::fabs(ata[p][c]) < 1e-300) return false;
    for (int k = 0; k <= m; ++k) std::swap(ata[c][k], ata[p][k]);
    for (int r = 0; r < m; ++r) {
      if (r == c) continue;
      const double f = ata[r][c] / ata[c][c];
      for (int k = c; k <= m; ++k) ata[r][k] -= f * ata[c][k];
    }
  }
  *x = {0, 0, 0};
  for (int r = 0; r < m; ++r) {
    (*x)[idx[r]] = ata[r][m] / ata[r][r];
    if (!std::isfinite((*x)[idx[r]])) return false;
  }
  *residual = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = a[i][0] * (*x)[0] + a[i][1] * (*x)[1] + a[i][2] * (*x)[2] - b[i];
    *residual += e * e;
  }
  return true;
}

}  // namespace

struct CostModel::StepCache {
  std::mutex mutex;
  std::shared_ptr<const Steps> last;
};

CostModel::CostModel(const Params& p) : p_(p), cache_(std::make_shared<StepCache>()) {}

// Each exchange step of rd and hd among p = 2^floor(log2 N) virtual ranks
// (fold.h: virtual rank v is rank 2v+1 below the fold's 2 rem ranks, v +
// rem above), and the fold: its time is its slowest pair's, which is a
// pair on one host (local_beta) or one whose host sends F of its ranks'
// messages off the host at once (F beta).
std::shared_ptr<const CostModel::Steps> CostModel::stepsOf(const Layout& l) const {
  {
    std::lock_guard<std::mutex> lock(cache_->mutex);
    if (cache_->last && cache_->last->layout.hosts == l.hosts &&
        cache_->last->layout.perHost == l.perHost) {
      return cache_->last;
    }
  }
  auto steps = std::make_shared<Steps>();
  steps->layout = l;
  const int N = l.ranks(), p = 1 << log2Floor(N), rem = N - p, L = l.perHost;
  const auto real = [&](int v) { return v < rem ? 2 * v + 1 : v + rem; };
  const auto cost = [&](const std::vector<std::pair<int, int>>& pairs) {
    std::vector<int> off(static_cast<size_t>(l.hosts), 0);
    bool local = false;
    int most = 0;
    for (const auto& [a, b] : pairs) {
      if (a / L == b / L) {
        local = true;
        continue;
      }
      most = std::max({most, ++off[a / L], ++off[b / L]});
    }
    const Step onHost = p_.hasLocal ? Step{p_.localAlpha, p_.localBeta} : Step{p_.alpha, p_.beta};
    if (most == 0) return onHost;
    return Step{p_.alpha, std::max(p_.beta * most, local ? onHost.beta : 0.0)};
  };
  std::vector<std::pair<int, int>> pairs;
  for (int mask = 1; mask < p; mask <<= 1) {
    pairs.clear();
    for (int v = 0; v < p; ++v) {
      if (v < (v ^ mask)) pairs.emplace_back(real(v), real(v ^ mask));
    }
    steps->exchange.push_back(cost(pairs));
  }
  if (rem > 0) {
    pairs.clear();
    for (int i = 0; i < rem; ++i) pairs.emplace_back(2 * i, 2 * i + 1);
    steps->fold = cost(pairs);
    steps->folds = true;
  }
  std::lock_guard<std::mutex> lock(cache_->mutex);
  cache_->last = steps;
  return steps;
}

const std::vector<Algorithm>& CostModel::algorithms() {
  static const std::vector<Algorithm> all = {Algorithm::kRecursiveDoubling,
                                             Algorithm::kHalvingDoubling, Algorithm::kRing};
  return all;
}

double CostModel::predict(Algorithm algo, uint64_t bytes, int ranks) const {
  return secondsOf(p_, algo, bytes, ranks);
}

double CostModel::predictLocal(uint64_t bytes, int ranks) const {
  if (!p_.hasLocal) return std::numeric_limits<double>::infinity();
  return secondsOf(Params{p_.localAlpha, p_.localBeta, p_.gamma}, Algorithm::kRing, bytes, ranks);
}

Algorithm CostModel::fastest(uint64_t bytes, int ranks) const {
  Algorithm best = algorithms().front();
  for (Algorithm a : algorithms()) {
    if (predict(a, bytes, ranks) < predict(best, bytes, ranks)) best = a;
  }
  return best;
}

double CostModel::predict(Algorithm algo, uint64_t bytes, const Layout& l) const {
  const int N = l.ranks();
  if (l.perHost <= 1 || N <= 1) return predict(algo, bytes, N);
  const double n = static_cast<double>(bytes), g = p_.gamma;
  if (algo == Algorithm::kRing) {  // one edge per host leaves it: beta, not L beta
    return l.hosts == 1 && p_.hasLocal ? predictLocal(bytes, N) : predict(algo, bytes, N);
  }
  if (algo != Algorithm::kRecursiveDoubling && algo != Algorithm::kHalvingDoubling) {
    return std::numeric_limits<double>::infinity();
  }
  const std::shared_ptr<const Steps> steps = stepsOf(l);
  const Step& f = steps->fold;
  double t = steps->folds ? 2 * f.alpha + 2 * n * f.beta + n * g : 0;
  for (size_t k = 0; k < steps->exchange.size(); ++k) {
    const Step& s = steps->exchange[k];
    if (algo == Algorithm::kRecursiveDoubling) {
      t += s.alpha + n * (s.beta + g);
    } else {  // step k moves n / 2^(k+1), there and back
      const double part = n / static_cast<double>(2ULL << k);
      t += 2 * s.alpha + part * (2 * s.beta + g);
    }
  }
  return t;
}

double CostModel::predictHierarchical(uint64_t bytes, const Layout& l,
                                      uint64_t segmentBytes) const {
  const int L = l.perHost;
  if (!p_.hasLocal || l.hosts < 2 || L < 2) return std::numeric_limits<double>::infinity();
  const double segments =
      std::max<double>(1, std::ceil(static_cast<double>(bytes) /
                                    static_cast<double>(std::max<uint64_t>(segmentBytes, 1))));
  const double n = static_cast<double>(bytes) / segments;  // one segment
  const double local = predictLocal(static_cast<uint64_t>(n), L);
  // L allreduces of n / L at once across the hosts, through one NIC each.
  const Params shared{p_.alpha, p_.beta * L, p_.gamma};
  double cross = std::numeric_limits<double>::infinity();
  for (Algorithm a : algorithms()) {
    cross = std::min(cross, secondsOf(shared, a, static_cast<uint64_t>(n / L), l.hosts));
  }
  return local + cross + (segments - 1) * std::max(local, cross);
}

CostModel::Choice CostModel::fastest(uint64_t bytes, const Layout& l, uint64_t segmentBytes) const {
  Choice best{false, algorithms().front(), predict(algorithms().front(), bytes, l)};
  for (Algorithm a : algorithms()) {
    const double t = predict(a, bytes, l);
    if (t < best.seconds) best = Choice{false, a, t};
  }
  const double h = predictHierarchical(bytes, l, segmentBytes);
  if (h < best.seconds) best = Choice{true, Algorithm::kAuto, h};
  return best;
}

namespace {

// Non-negative least squares over the unknowns of `a` (rows scaled to
// relative error, against 1): every subset of them solved, the best fit
// whose parameters are all >= 0; false when none is.
bool fitNonNegative(const std::vector<Coeffs>& a, std::array<bool, 3> allowed, Coeffs* best) {
  const std::vector<double> b(a.size(), 1.0);
  bool found = false;
  double bestResidual = std::numeric_limits<double>::infinity();
  for (int mask = 1; mask < 8; ++mask) {
    const std::array<bool, 3> use = {(mask & 1) != 0, (mask & 2) != 0, (mask & 4) != 0};
    if ((use[0] && !allowed[0]) || (use[1] && !allowed[1]) || (use[2] && !allowed[2])) continue;
    Coeffs x{};
    double residual = 0;
    if (!solve(a, b, use, &x, &residual)) continue;
    if (x[0] < 0 || x[1] < 0 || x[2] < 0 || residual >= bestResidual) continue;
    found = true;
    *best = x;
    bestResidual = residual;
  }
  return found;
}

}  // namespace

CostModel CostModel::fit(const std::vector<Sample>& samples) {
  std::vector<Coeffs> a;
  for (const Sample& s : samples) {
    bool known = false;
    Coeffs c = coefficients(s.algo, s.bytes, s.ranks, &known);
    if (!known || s.ranks < 2 || !(s.seconds > 0)) continue;
    for (double& v : c) v /= s.seconds;  // relative error
    a.push_back(c);
  }
  if (a.size() < 3) {
    bad("model fit", std::to_string(a.size()) +
                         " usable samples (timed allreduces of ring, rd or hd on 2+ ranks); "
                         "it needs at least 3");
  }
  Coeffs best{};
  if (!fitNonNegative(a, {true, true, true}, &best)) {
    bad("model fit", "the samples do not determine alpha, beta and gamma");
  }
  return CostModel(Params{best[0], best[1], best[2]});
}

// A shared-memory allreduce of n bytes on L ranks: a reduce-scatter and an
// allgather, 2(L-1) local_alpha + 2 (L-1)/L n local_beta, plus the known
// (L-1)/L n gamma, which comes off the measured time first.
CostModel CostModel::withLocal(const std::vector<Sample>& samples) const {
  std::vector<Coeffs> a;
  for (const Sample& s : samples) {
    bool known = false;  // the ring's form (predictLocal)
    const Coeffs c = coefficients(Algorithm::kRing, s.bytes, s.ranks, &known);
    const double rest = s.seconds - c[2] * p_.gamma;
    if (s.ranks < 2 || !(rest > 0)) continue;
    a.push_back({c[0] / rest, c[1] / rest, 0});
  }
  Coeffs best{};
  if (a.size() < 2 || !fitNonNegative(a, {true, true, false}, &best)) {
    bad("model fit", std::to_string(a.size()) +
                         " usable shared-memory samples (2+ ranks, longer than their reduction "
                         "alone); they must determine local_alpha and local_beta");
  }
  Params p = p_;
  p.hasLocal = true;
  p.localAlpha = best[0];
  p.localBeta = best[1];
  return CostModel(p);
}

std::string CostModel::text() const {
  char buf[256];
  if (!p_.hasLocal) {
    std::snprintf(buf, sizeof(buf), "gflow-model 1 alpha=%.9g beta=%.9g gamma=%.9g", p_.alpha,
                  p_.beta, p_.gamma);
  } else {
    std::snprintf(buf, sizeof(buf),
                  "gflow-model 2 alpha=%.9g beta=%.9g gamma=%.9g local_alpha=%.9g local_beta=%.9g",
                  p_.alpha, p_.beta, p_.gamma, p_.localAlpha, p_.localBeta);
  }
  return buf;
}

CostModel CostModel::parse(const std::string& text, const std::string& source) {
  std::istringstream is(text);
  std::string magic, version;
  if (!(is >> magic >> version) || magic != "gflow-model" || (version != "1" && version != "2")) {
    bad(source, "not a gflow cost model (it must start with 'gflow-model 1' or 'gflow-model 2')");
  }
  Params p;
  const std::array<std::pair<const char*, double*>, 5> fields = {{{"alpha", &p.alpha},
                                                                  {"beta", &p.beta},
                                                                  {"gamma", &p.gamma},
                                                                  {"local_alpha", &p.localAlpha},
                                                                  {"local_beta", &p.localBeta}}};
  std::array<bool, 5> seen{};
  for (std::string field; is >> field;) {
    const size_t eq = field.find('=');
    const std::string key = field.substr(0, eq);
    if (key == "fitted_on") continue;  // where it was fitted (gflow_model), informational
    size_t i = 0;
    while (i < fields.size() && key != fields[i].first) ++i;
    if (i == fields.size() || eq == std::string::npos) bad(source, "unknown field '" + field + "'");
    char* end = nullptr;
    const std::string v = field.substr(eq + 1);
    *fields[i].second = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !std::isfinite(*fields[i].second) || *fields[i].second < 0) {
      bad(source, "'" + field + "' is not a finite number >= 0");
    }
    seen[i] = true;
  }
  if (!seen[0] || !seen[1] || !seen[2]) bad(source, "it needs alpha=, beta= and gamma=");
  p.hasLocal = version == "2";
  if (seen[3] != p.hasLocal || seen[4] != p.hasLocal) {
    bad(source, "local_alpha= and local_beta= come with version 2, and only with it");
  }
  return CostModel(p);
}

CostModel CostModel::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) bad("GFLOW_MODEL=" + path, "cannot read the file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), "GFLOW_MODEL=" + path);
}

}  // namespace gflow::backend
